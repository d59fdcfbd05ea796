"""Training a configuration: the training strategies and the loop that runs them.

  strategy_base  the protocol every training strategy follows, and its setup;
  strategies     the registry and the paper's baselines (LBT, LRS, LARS, PoLo);
  ags_strategy   AGS and AGS-NS as training strategies over tula_ray.ags;
  data           loaders and the validation split;
  epochs         one epoch of a strategy, one evaluation pass;
  checkpoints    save and resume a run exactly;
  run            a run assembled (`prepare_run`), and `fit`: one run in this process;
  measure        one step, its time and its peak memory (what profiling measures);
  profile_settings  what every profiling trial of a search shares (`ProfileSettings`);
  profile_phases    the phases of a profiled batch, one function each;
  profile_sweep     a profiling worker group's model and data, built once, and a
                    batch's phases in order (its row), under any torch.distributed group.

Core: no Ray; the Ray Train worker loops in trainables/ call these.
"""
