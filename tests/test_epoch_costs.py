"""The profiled checkpoint's time includes its upload to the run's storage (issue 45,
item 5): `checkpoint_s` copies the checkpoint directory there through pyarrow's file
systems, as Ray Train persists `train`'s checkpoints, and removes the copy. No Ray."""

from __future__ import annotations

import time

import pyarrow.fs
import pytest
import torch
from fsspec.implementations.local import LocalFileSystem
from torch import nn

from tula_ray.training.epoch_costs import (CHECKPOINT_PROBE_PREFIX, checkpoint_s,
                                           scratch_directory, upload_directory)
from tula_ray.training.strategy_base import StrategySetup

UPLOAD_DELAY_S = 0.4  # each file the slow storage writes takes this long to open


class SlowLocalFileSystem(LocalFileSystem):
    """A local file system whose every file written is slow to open, as a remote store's
    round trip is; it records the paths written."""

    cachable = False  # fsspec would hand back one cached instance for every test
    written: list[str]

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.written = []

    def _open(self, path, mode="rb", *args, **kwargs):
        if "w" in mode:
            time.sleep(UPLOAD_DELAY_S)
            self.written.append(str(path))
        return super()._open(path, mode, *args, **kwargs)


def _model_and_setup() -> tuple[nn.Module, StrategySetup]:
    model = nn.Linear(8, 4)
    return model, StrategySetup("plain", torch.optim.SGD(model.parameters(), lr=0.1))


def test_the_checkpoint_is_uploaded_to_a_file_uri_and_nothing_is_left_behind(tmp_path):
    model, setup = _model_and_setup()
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    torch.save(model.state_dict(), directory / "state.pt")
    storage = tmp_path / "storage"
    with scratch_directory(f"file://{storage}") as (filesystem, path):
        upload_directory(str(directory), filesystem, path)
        copies = list(storage.iterdir())
        assert [copy.name[:len(CHECKPOINT_PROBE_PREFIX)] for copy in copies] == \
            [CHECKPOINT_PROBE_PREFIX]
        assert (copies[0] / "state.pt").read_bytes() == (directory / "state.pt").read_bytes()
    assert list(storage.iterdir()) == []

    seconds = checkpoint_s(model, setup, torch.device("cpu"), storage_path=f"file://{storage}")
    assert seconds > 0
    assert list(storage.iterdir()) == []


def test_the_measured_seconds_include_a_slow_storage_upload(tmp_path):
    model, setup = _model_and_setup()
    slow = SlowLocalFileSystem()
    storage = pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(slow))
    local_s = checkpoint_s(model, setup, torch.device("cpu"))
    assert local_s < UPLOAD_DELAY_S  # the write alone: not what the test measures
    seconds = checkpoint_s(model, setup, torch.device("cpu"), storage_path=str(tmp_path),
                           filesystem=storage)
    assert seconds >= UPLOAD_DELAY_S
    assert [path.rsplit("/", 2)[-2][:len(CHECKPOINT_PROBE_PREFIX)]
            for path in slow.written] == [CHECKPOINT_PROBE_PREFIX]
    assert list(tmp_path.iterdir()) == []  # the scratch copy is removed


def test_a_storage_that_refuses_the_write_fails_the_checkpoint(tmp_path):
    model, setup = _model_and_setup()
    # A file where the storage's directory should be: nothing can be created under it.
    refused = tmp_path / "not-a-directory"
    refused.write_text("")
    with pytest.raises(OSError):
        checkpoint_s(model, setup, torch.device("cpu"), storage_path=str(refused))
    assert refused.read_text() == ""
