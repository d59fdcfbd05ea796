"""fp16's loss scaling (issue 24, item 4), on CPU: torch's GradScaler in every strategy's
step, AGS's statistics taken on unscaled gradients, overflowing steps skipped without
touching AGS's state, and the scale kept across a checkpoint.

A GradScaler on float32 gradients multiplies by a power of two, which is exact: a loss-scaled
run must then equal the unscaled one bit for bit, which is what these tests hold it to."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.common import spawn_gloo
from tula_ray.ags import TulaOptimizer
from tula_ray.training.checkpoints import checkpoint_state, restore_state
from tula_ray.training.run import fit
from tula_ray.training.strategies import build_strategy
from tula_ray.workloads import Workload

SCALE = 2.0 ** 10


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def _batches(count: int, size: int = 32, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, 6, generator=generator),
             torch.randint(0, 3, (size,), generator=generator)) for _ in range(count)]


class BlowsUp:
    """A loss that overflows on chosen steps, for the whole batch or a sub-batch only."""

    def __init__(self, steps=(), small_batch_only: int | None = None) -> None:
        self.steps, self.small_batch_only, self.step = set(steps), small_batch_only, 0

    def __call__(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = nn.functional.cross_entropy(outputs, targets)
        hit = self.step in self.steps and (self.small_batch_only is None
                                           or len(targets) == self.small_batch_only)
        return loss * 1e38 if hit else loss


def _run(strategy: str, scaler: torch.amp.GradScaler | None, loss_fn=None, steps: int = 6,
         options=None):
    model = _model()
    setup = build_strategy(strategy, model, global_batch=32, steps_per_epoch=steps, epochs=1,
                           options=options)
    setup.scaler = scaler
    loss_fn = loss_fn or BlowsUp()
    history = []
    setup.start_epoch(0)
    for step, (inputs, targets) in enumerate(_batches(steps)):
        loss_fn.step = step
        setup.train_step(model, loss_fn, inputs, targets)
        history.append(_ags_state(setup.optimizer))
    return model, setup, history


def _ags_state(optimizer) -> dict:
    if not isinstance(optimizer, TulaOptimizer):
        return {}
    return {"counters": dict(optimizer.telemetry),
            "ema": [optimizer.state[p].get("small_sq_avg", torch.tensor(float("nan"))).clone()
                    for p in optimizer.parameters()]}


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("strategy,options", [("lbt", None), ("lrs", None),
                                              ("ags", {"small_batch": 8}),
                                              ("ags-ns", {"small_batch": 8})])
def test_a_loss_scaled_run_equals_the_unscaled_one(strategy, options):
    plain_model, _, plain_history = _run(strategy, None, options=options)
    scaled_model, setup, scaled_history = _run(
        strategy, torch.amp.GradScaler("cpu", init_scale=SCALE), options=options)
    torch.testing.assert_close(_flat(scaled_model), _flat(plain_model), rtol=1e-6, atol=0)
    for plain, scaled in zip(plain_history, scaled_history):  # AGS saw unscaled norms
        assert plain.get("counters") == scaled.get("counters")
        torch.testing.assert_close(scaled.get("ema"), plain.get("ema"), rtol=1e-6, atol=0,
                                   equal_nan=True)
    if isinstance(setup.optimizer, TulaOptimizer):
        assert setup.optimizer.telemetry["refreshes"] >= 1


def test_an_overflowing_step_is_skipped_and_ags_state_left_as_it_was():
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALE)
    model, setup, history = _run("ags-ns", scaler, BlowsUp(steps={3}),
                                 options={"small_batch": 8})
    optimizer = setup.optimizer
    assert [h["counters"]["steps"] for h in history] == [1, 2, 3, 3, 4, 5]  # step 3 skipped
    torch.testing.assert_close(history[3]["ema"], history[2]["ema"])  # not fed the overflow
    assert scaler.get_scale() == SCALE / 2  # the overflow halved it
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(torch.isfinite(s).all() for s in optimizer.scales.values())


def test_an_overflowing_sub_batch_skips_only_the_refresh():
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALE)
    _, setup, history = _run("ags-ns", scaler, BlowsUp(steps={2}, small_batch_only=8),
                             options={"small_batch": 8})
    counters = [h["counters"] for h in history]
    assert [c["steps"] for c in counters] == [1, 2, 3, 4, 5, 6]  # the large batch was finite
    assert [c["refreshes"] for c in counters] == [1, 2, 2, 3, 4, 5]  # ... its sub-batch not
    torch.testing.assert_close(history[2]["ema"], history[1]["ema"])
    assert scaler.get_scale() == SCALE


def test_the_checkpoint_keeps_the_loss_scale():
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALE)
    model, setup, _ = _run("ags-ns", scaler, BlowsUp(steps={1}), options={"small_batch": 8})
    state = checkpoint_state(model, setup, epoch=0)
    fresh_model = _model()
    fresh = build_strategy("ags-ns", fresh_model, global_batch=32, steps_per_epoch=6, epochs=1,
                           options={"small_batch": 8})
    fresh.scaler = torch.amp.GradScaler("cpu")
    assert restore_state(state, fresh_model, fresh) == 1
    assert fresh.scaler.get_scale() == scaler.get_scale() == SCALE / 2
    # A checkpoint written before loss scaling existed still loads.
    del state["loss_scaler"]
    assert restore_state(state, fresh_model, fresh) == 1


def test_a_users_fp16_workload_trains_and_reports_its_loss_scale():
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(256, 6, generator=generator),
                         torch.randint(0, 3, (256,), generator=generator))
    workload = Workload("mine-fp16", model_fn=_model, train_dataset_fn=lambda: data,
                        test_dataset_fn=lambda: data, epochs=2, precision="fp16")
    for strategy in ("lbt", "ags-ns"):
        frame = fit(workload, global_batch=64, strategy=strategy)
        assert frame["train_loss"].notna().all() and frame["test_loss"].notna().all()
        assert (frame["loss_scale"] > 0).all()


# --------------------------------------------------------------------------- two DDP workers

def _local_source_worker(rank: int, out_dir: str) -> None:
    generator = torch.Generator().manual_seed(10 + rank)  # different data per rank
    batches = [(torch.randn(32, 6, generator=generator),
                torch.randint(0, 3, (32,), generator=generator)) for _ in range(4)]
    results = {}
    for name, scaler in (("plain", None),
                         ("scaled", torch.amp.GradScaler("cpu", init_scale=SCALE))):
        model = nn.parallel.DistributedDataParallel(_model())
        setup = build_strategy("ags-ns", model, global_batch=64, steps_per_epoch=4, epochs=1)
        assert setup.optimizer.source == "local"  # the comm hook's gradients, scaled
        setup.scaler = scaler
        setup.start_epoch(0)
        for inputs, targets in batches:
            setup.train_step(model, nn.functional.cross_entropy, inputs, targets)
        results[name] = {"weights": _flat(model),
                         "ema": torch.stack([setup.optimizer.state[p]["small_sq_avg"]
                                             for p in setup.optimizer.parameters()])}
    torch.save(results, os.path.join(out_dir, f"{rank}.pt"))


def test_the_local_source_reads_unscaled_gradients_under_ddp(tmp_path):
    spawn_gloo(_local_source_worker, 2, str(tmp_path))
    for rank in (0, 1):
        got = torch.load(tmp_path / f"{rank}.pt")
        torch.testing.assert_close(got["scaled"]["ema"], got["plain"]["ema"], rtol=1e-6, atol=0)
        torch.testing.assert_close(got["scaled"]["weights"], got["plain"]["weights"], rtol=1e-6,
                                   atol=0)
