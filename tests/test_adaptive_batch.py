"""The adaptive global batch (issue 44, item 1), without Ray: the controller's decisions on
a synthetic phi trajectory and a known step-time model, gradient accumulation under a
memory bound forced low, and a user's own workload trained by `fit(adaptive=)`, whose
schedule a resumed run continues."""

import math
from dataclasses import replace

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from tests.text_workload import TEXT_WORKLOAD, Tokens, TextClassifier
from tula_ray.training.batch_controller import AdaptiveBatch, batch_options
from tula_ray.ags import TulaOptimizer
from tula_ray.training.batches import training_batches
from tula_ray.training.checkpoints import checkpoint_state, restore_state
from tula_ray.training.run import fit, prepare_run
from tula_ray.training.strategies import build_strategy

M0 = 32
# A known step-time model at N = 2: a fixed 40 ms plus 0.25 ms a sample. Throughput
# grows with B, efficiency falls: the best B grows with phi.
STEP_S = {batch: 0.040 + 0.00025 * batch for batch in (32, 64, 128, 256, 512)}


def _controller(**fields) -> AdaptiveBatch:
    return AdaptiveBatch(batch_options(STEP_S, 2), reference_batch=M0, start=32, **fields)


def _best_by_hand(phi: float) -> int:
    return max(STEP_S, key=lambda b: b / STEP_S[b] * (phi + M0) / (phi + b))


def test_the_batch_follows_a_rising_noise_scale_switch_by_switch():
    controller = _controller()
    trajectory = [math.nan, 20.0, 60.0, 150.0, 400.0, 1200.0, 5000.0]
    chosen = [controller.decide(phi, step=10 * i, samples=320 * i).global_batch
              for i, phi in enumerate(trajectory)]
    assert chosen[0] == 32  # no phi measured yet: B kept
    assert chosen == sorted(chosen) and chosen[-1] > chosen[1]  # B grows with phi
    for phi, batch, entry in zip(trajectory[1:], chosen[1:], controller.schedule[1:]):
        best = _best_by_hand(phi)
        gain = entry["goodputs"][str(best)] / entry["goodputs"][str(batch)] - 1
        assert batch == best or gain < 0.05  # the best, or kept within the hysteresis
        assert entry["noise_scale"] == phi and entry["reason"]
    switches = controller.switches()
    assert len(switches) >= 2 and all("->" in entry["reason"] for entry in switches)


def test_a_gain_under_the_hysteresis_keeps_the_batch():
    controller = _controller()
    phi = 40.0  # find two batches whose goodputs differ by less than 5 %
    goodputs = controller.goodputs(phi)
    best = max(goodputs, key=goodputs.get)
    assert controller.decide(phi, step=1, samples=32).global_batch == best
    # A phi where another batch is better, but by under 5 %: B stays.
    for other_phi in (45.0, 50.0, 55.0):
        others = controller.goodputs(other_phi)
        top = max(others, key=others.get)
        if top != best and others[top] < others[best] * 1.05:
            assert controller.decide(other_phi, step=2, samples=64).global_batch == best
            assert "kept" in controller.schedule[-1]["reason"]
            return
    pytest.fail("no phi gave a gain under the hysteresis: widen the search")


def test_the_controller_refuses_a_start_it_cannot_train():
    with pytest.raises(ValueError, match="start=48 is not among"):
        AdaptiveBatch(batch_options(STEP_S, 2), reference_batch=M0, start=48)
    with pytest.raises(ValueError, match="at least one"):
        AdaptiveBatch([], reference_batch=M0, start=32)


def test_a_memory_bound_forced_low_accumulates_gradients():
    options = {option.global_batch: option for option in batch_options(STEP_S, 2, 64)}
    assert options[128].accumulation == 1 and options[256].accumulation == 2
    assert options[512].accumulation == 4


def _tensor_workload(count: int = 512):
    """The user's text classifier, its tokens as in-memory tensors (the data path that
    can change its batch while training)."""
    def tensors(seed: int):
        tokens = Tokens(count, seed=seed)
        return TensorDataset(tokens.tokens, tokens.labels)
    return replace(TEXT_WORKLOAD, name="user-text-tensors",
                   train_dataset_fn=lambda: tensors(0), test_dataset_fn=lambda: tensors(1))


def test_accumulated_micro_batches_give_the_whole_batchs_gradient():
    inputs, targets = Tokens(64).tokens, Tokens(64).labels
    grads = []
    for parts in (1, 4):
        torch.manual_seed(0)
        model = TextClassifier()
        setup = build_strategy("lbt", model, global_batch=64, steps_per_epoch=1, epochs=1)
        setup.micro_batches = parts
        setup.optimizer.zero_grad()
        if parts == 1:
            setup.backward(model, nn.functional.cross_entropy, inputs, targets)
        else:
            setup.accumulated_backward(model, nn.functional.cross_entropy, inputs, targets)
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-7)


def _adaptive(start: int = 16, bound: int | None = None) -> AdaptiveBatch:
    # Slow small batches, so the goodput prefers a larger B once phi is measured.
    step_s = {16: 0.1, 32: 0.11, 64: 0.12, 128: 0.13}
    return AdaptiveBatch(batch_options(step_s, 1, bound), reference_batch=16, start=start)


def test_fit_adapts_a_users_batch_and_records_every_decision():
    frame = fit(_tensor_workload(), global_batch=16, epochs=2, strategy="lbt",
                adaptive=_adaptive(), eval_every_samples=64)
    schedule = frame.attrs["batch_schedule"]
    assert len(schedule) >= 4 and schedule["samples"].is_monotonic_increasing
    assert schedule["switched"].any()  # B changed once phi was measured
    assert frame["global_batch"].iloc[-1] == schedule["global_batch"].iloc[-1]
    first = schedule[schedule["switched"]].iloc[0]
    assert first["global_batch"] > 16 and not math.isnan(first["noise_scale"])


def test_fit_trains_a_batch_over_the_memory_bound_in_micro_batches():
    adaptive = _adaptive(start=64, bound=16)
    assert adaptive.option(64).accumulation == 4
    frame = fit(_tensor_workload(), global_batch=64, epochs=1, strategy="lbt",
                adaptive=adaptive, eval_every_samples=128)
    assert frame["train_loss"].notna().all()


def test_a_strategy_that_cannot_change_its_batch_is_refused():
    with pytest.raises(ValueError, match="cannot change its global batch"):
        fit(_tensor_workload(), global_batch=16, epochs=1, strategy="polo",
            adaptive=_adaptive())


def test_a_dataloader_dataset_is_refused_for_an_adaptive_batch():
    with pytest.raises(ValueError, match="in-memory tensors"):
        fit(TEXT_WORKLOAD, global_batch=16, epochs=1, strategy="lbt", adaptive=_adaptive())


def _epochs(run, start, stop):
    for epoch, _ in run.train_epochs(start):
        if epoch == stop - 1:
            return


def test_a_resumed_run_continues_the_same_schedule():
    workload = _tensor_workload()
    kwargs = dict(global_batch=16, epochs=3, strategy="lrs", eval_every_samples=64)
    whole = prepare_run(workload, adaptive=_adaptive(), **kwargs)
    _epochs(whole, 0, 3)
    first = prepare_run(workload, adaptive=_adaptive(), **kwargs)
    _epochs(first, 0, 1)
    state = checkpoint_state(first.model, first.setup, 0, noise=first.noise.state_dict(),
                             adaptive=first.adapter.state_dict())
    resumed = prepare_run(workload, adaptive=_adaptive(), **kwargs)
    resumed.adapter.resume(state["adaptive"])
    start = restore_state(state, resumed.model, resumed.setup)
    resumed.noise.load_state_dict(state["noise"])
    _epochs(resumed, start, 3)
    batches = [entry["global_batch"] for entry in whole.adapter.controller.schedule]
    assert [e["global_batch"] for e in resumed.adapter.controller.schedule] == batches
    assert resumed.setup.optimizer.param_groups[0]["lr"] == pytest.approx(
        whole.setup.optimizer.param_groups[0]["lr"])


def _two_workers(rank: int, out_dir: str) -> None:
    """One rank of an adaptive run on 2 gloo workers (DDP), its largest batch over a
    memory bound of 32 local samples (2 micro-batches)."""
    import os

    from tests.test_adaptive_batch import _tensor_workload  # the spawned rank's import

    step_s = {32: 0.1, 64: 0.11, 128: 0.12}
    adaptive = AdaptiveBatch(batch_options(step_s, 2, 32), reference_batch=32, start=32)
    run = prepare_run(_tensor_workload(), global_batch=32, epochs=2, strategy="ags-ns",
                      num_replicas=2, rank=rank, adaptive=adaptive, eval_every_samples=64,
                      wrap_model=nn.parallel.DistributedDataParallel)
    _epochs(run, 0, 2)
    weights = torch.cat([p.detach().reshape(-1) for p in run.model.parameters()])
    torch.save({"schedule": run.adapter.controller.schedule, "weights": weights,
                "micro_batches": run.setup.micro_batches}, os.path.join(out_dir, f"{rank}.pt"))


def test_two_workers_follow_rank_0s_decisions_and_stay_identical(tmp_path):
    from benchmarks.common import spawn_gloo

    spawn_gloo(_two_workers, 2, str(tmp_path), timeout_s=120)
    first, second = (torch.load(tmp_path / f"{rank}.pt") for rank in (0, 1))
    assert repr(first["schedule"]) == repr(second["schedule"])
    assert any(entry["switched"] for entry in first["schedule"])
    assert first["schedule"][-1]["global_batch"] == 128  # the largest: 2 micro-batches
    assert first["micro_batches"] == second["micro_batches"] == 2
    torch.testing.assert_close(first["weights"], second["weights"])  # replicas in step


def test_the_data_path_serves_a_new_batch_from_the_next_step_through_the_same_order():
    data = TensorDataset(torch.arange(100), torch.zeros(100, dtype=torch.long))
    whole = torch.cat([inputs for inputs, _ in training_batches(data, 10, "cpu", seed=3)])
    batches = training_batches(data, 10, "cpu", seed=3)
    sizes, served = [], []
    for inputs, _ in batches:
        sizes.append(len(inputs))
        served.append(inputs)
        if len(sizes) == 2:
            batches.resize(25)
    assert sizes == [10, 10, 25, 25, 25]  # the last 5 samples: no full batch, dropped
    assert torch.equal(torch.cat(served), whole[:95])


def test_the_lr_follows_the_batch_by_each_strategys_rule():
    model = TextClassifier()
    lrs = build_strategy("lrs", model, global_batch=256, steps_per_epoch=10, epochs=10)
    before = lrs.optimizer.param_groups[0]["lr"]
    lrs.set_global_batch(256, 512, micro_batches=2)
    assert lrs.optimizer.param_groups[0]["lr"] == pytest.approx(2 * before)
    assert lrs.micro_batches == 2
    lbt = build_strategy("lbt", model, global_batch=256, steps_per_epoch=10, epochs=10)
    unchanged = lbt.optimizer.param_groups[0]["lr"]
    lbt.set_global_batch(256, 64)
    assert lbt.optimizer.param_groups[0]["lr"] == unchanged
    ags = build_strategy("ags-ns", model, global_batch=256, steps_per_epoch=10, epochs=10,
                         options={"source": "sub-batch"})
    assert isinstance(ags.optimizer, TulaOptimizer)
    ceiling = ags.optimizer.param_groups[0]["s_max"]
    ags.set_global_batch(256, 1024)  # AdaScale's gain may reach B / 32 at the new B
    assert ags.optimizer.large_batch == 1024
    assert ags.optimizer.param_groups[0]["s_max"] == pytest.approx(4 * ceiling)


def test_ags_ns_at_its_reference_batch_takes_the_plain_steps_a_fixed_run_takes():
    """An adaptive run builds AGS-NS at its largest B. At B = 32, its reference batch, its
    steps must be the plain ones a fixed B = 32 run takes (before, they ran AGS's work:
    30 % more a step in adaptive-start-cost, and on one worker its sub-batch refresh
    refused a local batch of 32), AdaScale's progress counting one reference step each;
    above it, AGS scales again."""
    from tula_ray.workloads import sgd

    torch.manual_seed(0)
    models = [nn.Linear(6, 3), nn.Linear(6, 3)]
    models[1].load_state_dict(models[0].state_dict())
    adaptive = build_strategy("ags-ns", models[0], global_batch=2048, steps_per_epoch=10,
                              epochs=10, optimizer_fn=sgd, options={"source": "sub-batch"})
    adaptive.set_global_batch(2048, 32)
    fixed = build_strategy("ags-ns", models[1], global_batch=32, steps_per_epoch=10,
                           epochs=10, optimizer_fn=sgd, options={"source": "sub-batch"})
    assert isinstance(adaptive.optimizer, TulaOptimizer) and adaptive.optimizer.plain
    assert not isinstance(fixed.optimizer, TulaOptimizer)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(3):
        inputs = torch.randn(32, 6, generator=torch.Generator().manual_seed(step))
        targets = torch.randint(0, 3, (32,), generator=torch.Generator().manual_seed(step))
        for setup, model in zip((adaptive, fixed), models):
            setup.train_step(model, loss_fn, inputs, targets)
    for mine, theirs in zip(*(m.parameters() for m in models)):
        assert torch.equal(mine, theirs)
    assert adaptive.progress() == (pytest.approx(3.0), 32)
    assert adaptive.optimizer.telemetry["refreshes"] == 0
    adaptive.set_global_batch(32, 128)
    assert not adaptive.optimizer.plain
    adaptive.train_step(models[0], loss_fn, torch.randn(128, 6), torch.randint(0, 3, (128,)))
    assert adaptive.optimizer.telemetry["refreshes"] == 1
    assert adaptive.optimizer.telemetry["scaled"]
