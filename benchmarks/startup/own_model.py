"""Issue 41 figures: a user's own model, trained as they wrote it. Each part runs a driver
written as a user writes one from README (a fresh process, its own local Ray), one after
the other on an otherwise idle machine.

  plain loop       the model and data below in a plain B = 32 Adam loop, no Ray: the
                   accuracy 3 epochs reach there, what the searches' target means.
  text classifier  `EmbeddingBag` + `Linear` over integer tokens, a custom `Dataset`
                   subclass, 8000 training samples and `Adam(lr=1e-3)`;
                   `search(cluster_sizes=(1, 2), objective="time_to_accuracy", epochs=3)`,
                   then `train(plan, workload=...)` with its defaults. Goals: `train` uses
                   Adam inside AGS-NS, and the choice reaches at least 70 % test accuracy
                   in its predicted epochs to target (`plan.epochs_to_train`).
  batch limit      the same driver, its forward asserting a batch of at most 256, and
                   `search` with no argument changed. Goal: searched within the limit, or
                   refused within 30 s naming `max_batch`.

The protocol (data, seeds, targets) is fixed here, before the first run. Each part's
result is kept as soon as it is measured (results/own_model.partial.json, per commit),
so a run that stops resumes with the parts it lacks. --quick: the plain loop, 1 epoch of
8000 samples, nothing kept.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from benchmarks.common import Benchmark, markdown_table, provenance

NAME = "own_model"
ROOT = Path(__file__).resolve().parents[2]
GOAL_ACCURACY = 0.70
GOAL_REFUSAL_S = 30.0
BATCH_LIMIT = 256
DRIVER_TIMEOUT_S = 1800

# The workload, as a user's driver defines it (also run in-process by the plain loop).
WORKLOAD_CODE = textwrap.dedent('''\
    import torch
    from torch import nn
    from torch.utils.data import Dataset

    VOCAB, LENGTH, CLASSES, TOPIC, TOPIC_SHARE = 2000, 32, 4, 40, 0.12
    BATCH_LIMIT = None  # the batch-limit part sets it: the forward refuses larger batches


    class Tokens(Dataset):
        """Made-up documents: each token is one of its class's 40 topic words with
        probability 0.12, else any of the 2000 words."""

        def __init__(self, count, seed):
            generator = torch.Generator().manual_seed(seed)
            self.labels = torch.randint(0, CLASSES, (count,), generator=generator)
            uniform = torch.randint(0, VOCAB, (count, LENGTH), generator=generator)
            topic = (torch.randint(0, TOPIC, (count, LENGTH), generator=generator)
                     + self.labels[:, None] * TOPIC)
            picked = torch.rand((count, LENGTH), generator=generator) < TOPIC_SHARE
            self.tokens = torch.where(picked, topic, uniform)

        def __len__(self):
            return len(self.labels)

        def __getitem__(self, index):
            return self.tokens[index], int(self.labels[index])


    class TextClassifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.bag = nn.EmbeddingBag(VOCAB, 32, mode="mean")
            self.out = nn.Linear(32, CLASSES)

        def forward(self, tokens):
            if BATCH_LIMIT is not None:
                assert len(tokens) <= BATCH_LIMIT, f"batch {len(tokens)} > {BATCH_LIMIT}"
            return self.out(self.bag(tokens))


    def adam(params):
        return torch.optim.Adam(params, lr=1e-3)
''')

DRIVER = WORKLOAD_CODE + textwrap.dedent('''\

    import json, sys, time, warnings

    import tula_ray
    from tula_ray.workloads import Workload

    part = sys.argv[1]
    if part == "batch-limit":
        BATCH_LIMIT = 256
    workload = Workload("text-classifier", model_fn=TextClassifier,
                        train_dataset_fn=lambda: Tokens(8000, 0),
                        test_dataset_fn=lambda: Tokens(2000, 1), optimizer_fn=adam)
    started = time.perf_counter()
    result = {"part": part}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            plan = tula_ray.search(workload, cluster_sizes=(1, 2),
                                   objective="time_to_accuracy", epochs=3)
        except Exception as error:  # the batch-limit part may be refused: what it says
            result.update(outcome="refused", error_type=type(error).__name__,
                          error=str(error).splitlines()[0][:600],
                          seconds=time.perf_counter() - started)
            print("RESULT " + json.dumps(result), flush=True)
            sys.exit(0)
    chosen = plan.chosen
    result.update(
        outcome="searched", search_s=time.perf_counter() - started,
        warnings=[f"{w.category.__name__}: {w.message}"[:300] for w in caught],
        choice=[int(chosen.num_workers), int(chosen.global_batch)],
        max_local_batch=plan.meta.get("max_local_batch"),
        epochs_to_target=float(chosen.epochs_to_target), epochs_to_train=plan.epochs_to_train,
        reason=plan.choice.reason, noise_warning=plan.meta.get("noise_warning"),
        largest_local_batch_profiled=int(plan.profiles["local_batch"].max()))
    if part == "text-classifier":
        started = time.perf_counter()
        trained = tula_ray.train(plan, workload=workload)
        metrics = trained.metrics
        result.update(train_s=time.perf_counter() - started, strategy=trained.strategy,
                      optimizer=sorted(set(metrics["optimizer"])),
                      epochs_trained=int(len(metrics)),
                      test_accuracy=[float(a) for a in metrics["test_accuracy"]])
    print("RESULT " + json.dumps(result), flush=True)
''')


def plain_loop(epochs: int, train_size: int, batch: int = 32, seed: int = 0) -> list[float]:
    """Test accuracy after each epoch of a plain Adam loop at `batch`, one process."""
    import torch
    from torch.utils.data import DataLoader

    code: dict = {}
    exec(compile(WORKLOAD_CODE, "<own_model workload>", "exec"), code)  # noqa: S102 - our text
    torch.manual_seed(seed)
    model = code["TextClassifier"]()
    optimizer = code["adam"](model.parameters())
    train, test = code["Tokens"](train_size, 0), code["Tokens"](2000, 1)
    accuracies = []
    for _ in range(epochs):
        for tokens, labels in DataLoader(train, batch_size=batch, shuffle=True):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(tokens), labels).backward()
            optimizer.step()
        with torch.no_grad():
            predicted = model(test.tokens).argmax(1)
        accuracies.append(float((predicted == test.labels).float().mean()))
    return accuracies


def run_driver(part: str, scratch: Path) -> dict:
    """The driver as a user runs it (`python driver.py`), in a fresh process: its result
    line, its wall time, and what it printed besides (its lines, the widest)."""
    driver = scratch / "driver.py"
    driver.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(driver), part], capture_output=True, text=True,
                          timeout=DRIVER_TIMEOUT_S, env=env, cwd=scratch)
    wall = time.perf_counter() - started
    output = done.stdout + done.stderr
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"{part} driver failed (rc {done.returncode}):\n{output[-4000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    # What tula-ray and Ray printed: the driver's own result line is this benchmark's.
    printed = [line for line in output.splitlines() if not line.startswith("RESULT ")]
    result.update(wall_s=wall, printed_lines=len(printed),
                  widest_line=max(map(len, printed), default=0), printed="\n".join(printed))
    return result


def run(quick: bool = False) -> dict:
    benchmark = Benchmark(NAME, quick)
    if quick:
        return benchmark.record({"plain_loop": plain_loop(epochs=1, train_size=8000)}, report)
    kept = benchmark.kept_parts(provenance()["commit"])
    kept.measure("plain_loop", lambda: {"test_accuracy": plain_loop(epochs=3, train_size=8000)})
    for part in ("text-classifier", "batch-limit"):
        fresh = part not in kept.parts
        measured = kept.measure(part, lambda: _in_scratch(part))
        if fresh:
            print(f"{part}: {json.dumps(measured)[:400]}", flush=True)
    return benchmark.record(dict(kept.parts), report)


def _in_scratch(part: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="tula-own-model-") as scratch:
        return run_driver(part, Path(scratch))


def _goal(met: bool) -> str:
    return "met" if met else "missed"


def report(result: dict) -> str:
    lines = ["## A user's own model, trained as written (issue 41)", "",
             f"`{result['command']}` at {result['commit']}, {result['date']}, "
             f"{result['machine']}.", ""]
    plain = result.get("plain_loop") or {}
    accuracies = plain["test_accuracy"] if isinstance(plain, dict) else plain
    lines.append("- Plain Adam loop at B = 32, no Ray, test accuracy after each epoch: "
                 + ", ".join(f"{a:.1%}" for a in accuracies) + ".")
    text = result.get("text-classifier")
    if text:
        reached = [a >= GOAL_ACCURACY for a in text["test_accuracy"]]
        first = reached.index(True) + 1 if any(reached) else None
        lines += [
            f"- Text classifier: chose N={text['choice'][0]} B={text['choice'][1]}, "
            f"epochs to target {text['epochs_to_target']:.2f} (trained "
            f"{text['epochs_trained']}); `train` ran {text['strategy']} with "
            f"{', '.join(text['optimizer'])}; search {text['search_s']:.0f} s, train "
            f"{text['train_s']:.0f} s; the driver printed {text['printed_lines']} lines "
            f"(widest {text['widest_line']} characters).",
            "",
            markdown_table(["epoch", "test accuracy"],
                           [[i + 1, f"{a:.1%}"] for i, a in enumerate(text["test_accuracy"])]),
            "",
            f"  Goal (>= {GOAL_ACCURACY:.0%} in the predicted epochs to target): "
            f"{_goal(bool(reached) and reached[-1])}"
            + (f"; first reached after epoch {first}." if first else "."),
        ]
        lines.append(f"  The choice's reason: {text['reason']}.")
        if text.get("noise_warning"):
            lines.append(f"  The plan warned: {text['noise_warning']}")
    limit = result.get("batch-limit")
    if limit:
        if limit["outcome"] == "searched":
            within = limit["largest_local_batch_profiled"] <= BATCH_LIMIT
            lines.append(
                f"- Batch limit ({BATCH_LIMIT}): searched with no argument changed; largest "
                f"local batch profiled {limit['largest_local_batch_profiled']}, bound "
                f"{limit['max_local_batch']}, chose N={limit['choice'][0]} "
                f"B={limit['choice'][1]}, in {limit['search_s']:.0f} s. Goal: {_goal(within)}.")
        else:
            named = "max_batch" in limit["error"]
            fast = limit["seconds"] <= GOAL_REFUSAL_S
            lines.append(
                f"- Batch limit ({BATCH_LIMIT}): refused after {limit['seconds']:.1f} s with "
                f"{limit['error_type']}: {limit['error']}. Goal: {_goal(named and fast)}.")
    if text and text.get("printed"):
        lines += ["", "What the text classifier's driver printed (search, then train):", "",
                  "```text", text["printed"], "```"]
    return "\n".join(lines) + "\n"
