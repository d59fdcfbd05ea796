"""Where Fashion-MNIST comes from (tula_ray.workloads.fashion_mnist_files) and how it is loaded
(tula_ray.workloads.datasets), without Ray and without the network: the downloads are served by
an HTTP server on loopback that this module starts."""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import io
import multiprocessing
import os
import socket
import struct
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest
import torch

from tula_ray.workloads import datasets
from tula_ray.workloads import fashion_mnist_files as files
from tula_ray.workloads import get_workload, stage

REAL_DEBIAN_FETCH = files.fetch_debian_package  # `places` switches the downloads off


def _write_idx(directory: Path, n: int = 5, gz: bool = True) -> None:
    """Tiny valid idx files: image i is filled with value i, label i % 10."""
    directory.mkdir(parents=True, exist_ok=True)
    for prefix, count in (("train", n), ("t10k", 2)):
        images = struct.pack(">IIII", 2051, count, 28, 28) + b"".join(
            bytes([i]) * 784 for i in range(count))
        labels = struct.pack(">II", 2049, count) + bytes(i % 10 for i in range(count))
        for kind, payload in (("images-idx3", images), ("labels-idx1", labels)):
            name = f"{prefix}-{kind}-ubyte"
            if gz:
                (directory / f"{name}.gz").write_bytes(gzip.compress(payload))
            else:
                (directory / name).write_bytes(payload)


@pytest.fixture
def places(tmp_path, monkeypatch):
    """Every place the resolver looks at, empty, and no download source."""
    dirs = {k: tmp_path / k for k in ("root", "env", "debian", "cache")}
    monkeypatch.setattr(files, "DEBIAN_DATA_DIR", dirs["debian"])
    monkeypatch.setenv(files.CACHE_DIR_ENV, str(dirs["cache"]))
    monkeypatch.setenv(files.DATA_DIR_ENV, str(dirs["env"]))

    def no_network(directory, deadline):
        raise OSError("network is unreachable")

    monkeypatch.setattr(files, "fetch_debian_package", no_network)
    monkeypatch.setattr(files, "fetch_torchvision", no_network)
    datasets._fashion_mnist_tensors.cache_clear()
    return dirs


def test_nothing_found_is_a_clear_error(places):
    with pytest.raises(FileNotFoundError) as info:
        files.locate(places["root"])
    message = str(info.value)
    for place in ("root", "env", "debian"):
        assert str(places[place]) in message
    assert "apt-get install dataset-fashion-mnist" in message and "TULA_DATA_DIR" in message
    assert "Debian's archive (OSError: network is unreachable)" in message
    assert "torchvision's mirrors (OSError: network is unreachable)" in message


def test_user_root_comes_first(places):
    _write_idx(places["root"] / "FashionMNIST" / "raw", gz=False)
    _write_idx(places["env"])
    located = files.locate(places["root"])
    assert located.root == places["root"] and str(places["root"]) in located.source


def test_env_dir_then_debian_flat_gz_are_unpacked_into_cache(places, monkeypatch):
    _write_idx(places["debian"], n=7)
    _write_idx(places["env"], n=5)
    cache_root = places["cache"] / "tula-ray" / "fashion-mnist"
    assert files.locate().root == cache_root  # env's .gz unpacked into the cache
    assert len(datasets.fashion_mnist(True)) == 5
    assert not any(p.name.endswith("ubyte") for p in places["env"].iterdir())  # source untouched

    monkeypatch.delenv(files.DATA_DIR_ENV)
    monkeypatch.setenv(files.CACHE_DIR_ENV, str(places["cache"] / "second"))
    located = files.locate()
    assert "Debian package dataset-fashion-mnist" in located.source
    assert len(datasets.fashion_mnist(True)) == 7  # the Debian directory
    assert len(datasets.fashion_mnist(False)) == 2


def test_train_subset_first_or_seeded(places):
    _write_idx(places["env"], n=20)
    first = datasets.fashion_mnist(True, train_subset=4)
    assert first.tensors[1].tolist() == [0, 1, 2, 3]
    seeded = datasets.fashion_mnist(True, train_subset=4, subset_seed=1)
    assert seeded.tensors[1].tolist() == datasets.fashion_mnist(
        True, train_subset=4, subset_seed=1).tensors[1].tolist()
    assert seeded.tensors[1].tolist() != [0, 1, 2, 3]
    assert get_workload("fashion-mnist-cnn", train_subset=4).dataset_size == 4


def test_decoded_images_are_kept_so_later_processes_skip_torchvision(places):
    """The first load decodes with torchvision and keeps uint8 tensors in the cache; a
    later process (a Ray worker of the next launch) loads them without torchvision;
    replaced idx files are decoded again."""
    raw, root = places["root"] / "FashionMNIST" / "raw", str(places["root"])
    _write_idx(raw, n=6, gz=False)
    first = datasets.fashion_mnist(True, root=root)
    kept = list((places["cache"] / "tula-ray" / "fashion-mnist" / "decoded").glob("train-*.pt"))
    assert len(kept) == 1
    script = ("import sys, tula_ray.workloads.datasets as d; data = d.fashion_mnist(True, root=sys.argv[1]); "
              "print(len(data), 'torchvision' in sys.modules, float(data.tensors[0].sum()))")
    out = subprocess.run([sys.executable, "-c", script, root], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[:2] == ["6", "False"]
    assert float(out[2]) == pytest.approx(float(first.tensors[0].sum()), rel=1e-6)

    _write_idx(raw, n=9, gz=False)  # replaced files: another key, decoded again
    datasets._fashion_mnist_tensors.cache_clear()
    assert len(datasets.fashion_mnist(True, root=root)) == 9


# ----------------------------------------------------------------- downloads

def _ar(members: dict[str, bytes]) -> bytes:
    """A Unix ar archive (the container of a .deb)."""
    out = b"!<arch>\n"
    for name, data in members.items():
        out += f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode()
        out += data + (b"\n" if len(data) % 2 else b"")
    return out


def _tar_xz(members: dict[str, bytes]) -> bytes:
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w:xz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return stream.getvalue()


def _debian_package(source: Path) -> bytes:
    """A .deb laid out as Debian's dataset-fashion-mnist, holding `source`'s .gz files."""
    data = {f"{files.DEBIAN_FILES_IN_PACKAGE}{p.name}": p.read_bytes()
            for p in sorted(source.glob("*.gz"))}
    data["./usr/share/doc/dataset-fashion-mnist/copyright"] = b"MIT\n"
    return _ar({"debian-binary": b"2.0\n", "control.tar.xz": _tar_xz({}),
                "data.tar.xz": _tar_xz(data)})


@pytest.fixture
def mirror(tmp_path):
    """An HTTP server on loopback serving `served` (path -> bytes); 404 elsewhere."""
    served: dict[str, bytes] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = served.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", served
    finally:
        server.shutdown()


def test_debian_package_from_a_mirror_is_checked_unpacked_and_its_source_recorded(
        places, mirror, tmp_path, monkeypatch):
    """The Debian source as `locate` calls it: $TULA_DEBIAN_MIRROR's package, checked
    against its SHA-256, unpacked into the cache, and the cache says where it came from."""
    url, served = mirror
    _write_idx(tmp_path / "original", n=11)
    package = _debian_package(tmp_path / "original")
    served["/debian/pool/fashion.deb"] = package
    monkeypatch.setenv(files.DEBIAN_MIRROR_ENV, f"{url}/debian")
    monkeypatch.setattr(files, "fetch_debian_package", functools.partial(
        REAL_DEBIAN_FETCH, path="pool/fashion.deb", sha256=hashlib.sha256(package).hexdigest()))

    located = files.locate()
    assert located.source.endswith(f"(downloaded from {url}/debian/pool/fashion.deb on "
                                   f"{time.strftime('%Y-%m-%d', time.gmtime())})")
    assert len(datasets.fashion_mnist(True)) == 11
    assert files.locate().source == located.source  # the cache says where it came from


def test_a_package_with_another_checksum_is_refused_and_nothing_is_kept(
        places, mirror, tmp_path):
    url, served = mirror
    _write_idx(tmp_path / "original")
    served["/debian/pool/fashion.deb"] = _debian_package(tmp_path / "original")
    with pytest.raises(ValueError, match="has SHA-256 .*, not Debian's 0+"):
        REAL_DEBIAN_FETCH(tmp_path, time.monotonic() + 5, mirror=f"{url}/debian",
                          path="pool/fashion.deb", sha256="0" * 64)
    failures = files.download_into_cache(
        [("Debian's archive", lambda directory, deadline: REAL_DEBIAN_FETCH(
            directory, deadline, mirror=f"{url}/debian", path="pool/fashion.deb",
            sha256="0" * 64))])
    assert len(failures) == 1 and "SHA-256" in failures[0]
    assert not (places["cache"] / "tula-ray" / "fashion-mnist" / "FashionMNIST").exists()


def test_sources_that_never_answer_are_given_up_within_the_budget(places):
    """A host that accepts connections and never answers (a black hole) costs each source
    at most CONNECT_TIMEOUT_S and all of them at most DOWNLOAD_BUDGET_S."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    fetch = lambda directory, deadline: REAL_DEBIAN_FETCH(  # noqa: E731
        directory, deadline, mirror=url)
    try:
        started = time.monotonic()
        failures = files.download_into_cache([("first", fetch), ("second", fetch),
                                              ("third", fetch)], budget_s=4.0)
        took = time.monotonic() - started
    finally:
        silent.close()
    assert took < 4.0 + 1.0, took
    assert len(failures) == 3 and "timed out" in failures[0]
    assert "not tried" in failures[-1] or "timed out" in failures[-1]


# ------------------------------------------- one download per machine (issue 26 item 5)

RANKS = 4  # processes of one node that all want the data at once


def _slow_fetch(directory: Path, deadline: float, *, source: Path, runs: Path) -> str:
    """A download that takes a while: the other ranks arrive while it runs."""
    with open(runs, "a") as log:  # O_APPEND: one line per run, whichever process
        log.write(f"{os.getpid()}\n")
    time.sleep(1.0)
    for gz in source.glob("*.gz"):
        (directory / gz.name).write_bytes(gz.read_bytes())
    return "https://fake.example/fashion"


def _rank(barrier, results) -> None:
    barrier.wait()  # every rank asks at the same moment
    located = files.locate()
    labels = (files._raw_dir(located.root) / "train-labels-idx1-ubyte").read_bytes()
    results.put((str(located.root), located.source, labels))


def test_concurrent_ranks_download_once_and_all_read_the_data(places, tmp_path, monkeypatch):
    _write_idx(tmp_path / "original", n=13)
    runs = tmp_path / "runs.log"
    monkeypatch.setattr(files, "fetch_debian_package", functools.partial(
        _slow_fetch, source=tmp_path / "original", runs=runs))
    context = multiprocessing.get_context("fork")  # the ranks inherit the fake download
    barrier, results = context.Barrier(RANKS), context.Queue()
    ranks = [context.Process(target=_rank, args=(barrier, results)) for _ in range(RANKS)]
    for rank in ranks:
        rank.start()
    got = [results.get(timeout=60) for _ in ranks]
    for rank in ranks:
        rank.join(timeout=60)
        assert rank.exitcode == 0
    assert len(runs.read_text().split()) == 1  # one rank downloaded, the others waited
    expected = (tmp_path / "original" / "train-labels-idx1-ubyte.gz").read_bytes()
    assert {root for root, _, _ in got} == {str(files.cache_dir())}
    assert all("downloaded from https://fake.example/fashion" in source for _, source, _ in got)
    assert all(labels == gzip.decompress(expected)
               for _, _, labels in got)
    assert not [p.name for p in files._raw_dir(files.cache_dir()).iterdir()
                if p.name.startswith(".")]  # no temporary file left behind


def test_a_lock_held_too_long_is_a_clear_timeout(tmp_path):
    lock = tmp_path / "held.lock"
    with files.exclusive_lock(lock, timeout_s=1.0):
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=f"waited 0.3 s for the lock {lock}"):
            with files.exclusive_lock(lock, timeout_s=0.3):
                pass
        assert time.monotonic() - started < 2.0
    with files.exclusive_lock(lock, timeout_s=0.3):  # released: free again
        pass


def test_staging_fetches_and_decodes_both_splits(places, tmp_path, monkeypatch, capsys):
    _write_idx(tmp_path / "original", n=8)
    monkeypatch.setattr(files, "fetch_debian_package", functools.partial(
        _slow_fetch, source=tmp_path / "original", runs=tmp_path / "runs.log"))
    assert stage.main([]) == 0
    assert "Fashion-MNIST staged:" in capsys.readouterr().out
    decoded = sorted(p.name.split("-")[0] for p in (files.cache_dir() / "decoded").glob("*.pt"))
    assert decoded == ["t10k", "train"]
    assert len(datasets.fashion_mnist(True)) == 8


def test_staging_without_any_source_says_what_to_do(places, capsys):
    assert stage.main([]) == 1
    assert "apt-get install dataset-fashion-mnist" in capsys.readouterr().err


def test_the_ar_reader_refuses_what_is_no_debian_package():
    with pytest.raises(ValueError, match="not a Debian package"):
        files._ar_member(b"<html>404</html>", "data.tar")
    with pytest.raises(ValueError, match="no data.tar"):
        files._ar_member(_ar({"debian-binary": b"2.0\n"}), "data.tar")


def test_real_fashion_mnist_is_normalised():
    """The real data, got as the demo gets them (on a bare machine: downloaded first)."""
    dataset = get_workload("fashion-mnist-cnn").train_dataset_fn()
    images = dataset.tensors[0]
    assert images.shape == (60_000, 1, 28, 28) and images.dtype == torch.float32
    assert abs(float(images.mean())) < 0.05 and abs(float(images.std()) - 1) < 0.05
