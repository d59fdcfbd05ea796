"""A training strategy of one's own: plain Adam at the workload's learning rate."""

import torch

import tula_ray
from tula_ray.training.strategy_base import BaseStrategy, StrategySetup, check_option_names


class AdamStrategy(BaseStrategy):
    name = "adam-ext"
    options = ("betas",)

    def build(self, model, *, global_batch, steps_per_epoch, epochs, lr, momentum, weight_decay,
              options):
        options = check_option_names(self, options)
        optimizer = torch.optim.Adam(model.parameters(), lr=lr,
                                     betas=tuple(options.get("betas", (0.9, 0.999))))
        return StrategySetup(self.name, optimizer)


tula_ray.register_training_strategy(AdamStrategy())
