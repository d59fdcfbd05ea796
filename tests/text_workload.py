"""A user's text classifier (issue 41): integer tokens in a Dataset of their own (the
DataLoader path), an `EmbeddingBag` model and Adam. The same shape of workload as the
one `benchmarks/startup/own_model.py` trains to an accuracy; here it is small and only has to
run through the search's paths."""

import torch
from torch import nn
from torch.utils.data import Dataset

from tula_ray.workloads import Workload

VOCAB, LENGTH, CLASSES, TOPIC = 500, 16, 4, 20


class Tokens(Dataset):
    """Made-up documents: a third of the tokens are one of their class's topic words."""

    def __init__(self, count: int = 256, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, CLASSES, (count,), generator=generator)
        uniform = torch.randint(0, VOCAB, (count, LENGTH), generator=generator)
        topic = (torch.randint(0, TOPIC, (count, LENGTH), generator=generator)
                 + self.labels[:, None] * TOPIC)
        picked = torch.rand((count, LENGTH), generator=generator) < 1 / 3
        self.tokens = torch.where(picked, topic, uniform)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.tokens[index], int(self.labels[index])


class TextClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(VOCAB, 32, mode="mean")
        self.out = nn.Linear(32, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(self.bag(tokens))


def adam(params) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=1e-3)


TEXT_WORKLOAD = Workload("user-text", model_fn=TextClassifier, train_dataset_fn=Tokens,
                         test_dataset_fn=lambda: Tokens(256, seed=1), optimizer_fn=adam)
