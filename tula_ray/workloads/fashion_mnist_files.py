"""Where the demo's Fashion-MNIST comes from: a directory on this machine, or a download.

`locate()` looks, in order, at:
  1. the caller's `root`, then $TULA_DATA_DIR;
  2. /usr/share/datasets/fashion-mnist, where Debian's package `dataset-fashion-mnist`
     puts the four original .gz files;
  3. the per-user cache ($TULA_CACHE_DIR, else $XDG_CACHE_HOME or ~/.cache, then
     tula-ray/fashion-mnist), where downloads go;
and then downloads into the cache from the first source that answers:
  4. Debian's archive (`$TULA_DEBIAN_MIRROR`, default https://deb.debian.org/debian): the
     same package's .deb, checked against its SHA-256 from Debian's signed index, so a
     machine whose only network is its package registries gets the real data;
  5. torchvision's mirrors of the original files, checked against torchvision's md5s.
Each place may hold torchvision's layout (FashionMNIST/raw/...) or the four idx files,
plain or .gz. The result says where the files came from (`Located.source`).
One process per machine downloads (`exclusive_lock` on a file in the cache): the other
ranks of a node wait, then read its files. Every file is written under a private name
and renamed, so no process reads half of one.

No torch at import: the `tula-ray demo` driver calls this before anything heavy, so a
machine with no means to get the data stops within seconds with what to do.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import io
import logging
import os
import shutil
import tarfile
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

logger = logging.getLogger(__name__)

DATA_DIR_ENV = "TULA_DATA_DIR"
CACHE_DIR_ENV = "TULA_CACHE_DIR"
DEBIAN_MIRROR_ENV = "TULA_DEBIAN_MIRROR"
DEBIAN_DATA_DIR = Path("/usr/share/datasets/fashion-mnist")  # package dataset-fashion-mnist
DEBIAN_MIRROR_DEFAULT = "https://deb.debian.org/debian"
# The package's .deb in Debian's pool (the version in bookworm, trixie and sid since 2020)
# and its SHA-256 as Debian's signed Packages index gives it.
DEBIAN_PACKAGE_PATH = ("pool/main/d/dataset-fashion-mnist/"
                       "dataset-fashion-mnist_0.0~git20200523.55506a9-1_all.deb")
DEBIAN_PACKAGE_SHA256 = "39e172fe32dd318ebb3e512220c3beea2fa47d7e20bab348fb4e0922d6beefc0"
DEBIAN_FILES_IN_PACKAGE = "./usr/share/datasets/fashion-mnist/"
# A source that does not answer within CONNECT_TIMEOUT_S is taken as unreachable; all
# sources together get DOWNLOAD_BUDGET_S to answer, so that a machine without any route
# stops within the 10 s issue 22 allows, imports included. A transfer under way is not cut.
CONNECT_TIMEOUT_S = 3.0
DOWNLOAD_BUDGET_S = 6.0
DOWNLOAD_LOCK_TIMEOUT_S = 600.0  # a worker waits this long for another's download
DOWNLOAD_LOCK_FILE = ".download.lock"  # in the cache: held by the one process downloading
LOCK_POLL_S = 0.2  # how often a waiting process tries the lock again
SOURCE_FILE = "SOURCE"  # in the cache's raw directory: where its files came from
IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
HOW_TO_GET_IT = (
    "To get it: on Debian or Ubuntu, `sudo apt-get install dataset-fashion-mnist`; "
    "elsewhere, put the four files train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
    "t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz of "
    "https://github.com/zalandoresearch/fashion-mnist (folder data/fashion) in a directory "
    f"and set {DATA_DIR_ENV} to it. Behind a proxy, set https_proxy; a Debian mirror of "
    f"your own: {DEBIAN_MIRROR_ENV}")


@dataclass(frozen=True)
class Located:
    """Fashion-MNIST on this machine: `root`, a directory torchvision's FashionMNIST
    accepts, and `source`, where the files came from (for the user to read)."""

    root: Path
    source: str


def cache_dir() -> Path:
    """The per-user cache of tula-ray's Fashion-MNIST (downloads, decoded tensors)."""
    base = os.environ.get(CACHE_DIR_ENV) or os.environ.get("XDG_CACHE_HOME")
    return Path(base or Path.home() / ".cache") / "tula-ray" / "fashion-mnist"


def _raw_dir(root: Path) -> Path:
    return root / "FashionMNIST" / "raw"


def _has_files(directory: Path, suffix: str = "") -> bool:
    return all((directory / f"{name}{suffix}").is_file() for name in IDX_FILES)


def _into_cache(source: Path, gz: bool) -> Path:
    """The four idx files of `source` in torchvision's layout under the cache; returns its root.

    .gz files are unpacked (Debian's are recompressed: their md5 differ from
    torchvision's list, so torchvision's own extract step would go to the network);
    plain files are linked. The cache holds one copy: files already there are kept.
    """
    root = cache_dir()
    raw = _raw_dir(root)
    raw.mkdir(parents=True, exist_ok=True)
    for name in IDX_FILES:
        target = raw / name
        if target.is_file():
            continue
        if not gz:  # a link made under a private name, renamed: two workers may link at once
            link = raw / f".{name}.{os.getpid()}.link"
            link.unlink(missing_ok=True)
            link.symlink_to((source / name).resolve())
            os.replace(link, target)
            continue
        # Two Ray workers may unpack at once: write privately, rename atomically.
        fd, tmp = tempfile.mkstemp(dir=raw, prefix=f".{name}.")
        with os.fdopen(fd, "wb") as out, gzip.open(source / f"{name}.gz", "rb") as src:
            shutil.copyfileobj(src, out)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; it is public data
        os.replace(tmp, target)
    logger.info("Fashion-MNIST from %s is in %s", source, raw)
    return root


def _found(place: Path) -> Located | None:
    """Fashion-MNIST in `place` (any of the layouts), made usable; None if it is not there."""
    raw = _raw_dir(place)
    if _has_files(raw):
        recorded = raw / SOURCE_FILE
        origin = recorded.read_text().strip() if recorded.is_file() else "files found there"
        return Located(place, f"{raw} ({origin})")
    if _has_files(place):  # plain idx files directly in the directory
        return Located(_into_cache(place, gz=False), f"{place} (idx files)")
    for gz_dir in (raw, place):
        if _has_files(gz_dir, ".gz"):
            what = " (Debian package dataset-fashion-mnist)" if gz_dir == DEBIAN_DATA_DIR else ""
            return Located(_into_cache(gz_dir, gz=True), f"{gz_dir}{what}")
    return None


def locate(root: str | os.PathLike | None = None, download: bool = True) -> Located:
    """Fashion-MNIST on this machine, downloaded into the cache if needed (module docstring).

    Raises FileNotFoundError naming every place and source tried, and what to do, when
    no means works (`download=False`: without trying the network)."""
    places = [Path(p).expanduser() for p in (root, os.environ.get(DATA_DIR_ENV)) if p]
    places += [DEBIAN_DATA_DIR, cache_dir()]
    for place in places:
        located = _found(place)
        if located is not None:
            return located
    tried = [f"{place} (no Fashion-MNIST files)" for place in places]
    if download:
        # One download per machine: the 8 ranks of a GPU node all start here at once.
        cache_dir().mkdir(parents=True, exist_ok=True)
        with exclusive_lock(cache_dir() / DOWNLOAD_LOCK_FILE, DOWNLOAD_LOCK_TIMEOUT_S):
            located = _found(cache_dir())  # another process's download, while we waited
            if located is not None:
                return located
            failures = download_into_cache()
            located = _found(cache_dir())
            if located is not None:
                return located
        tried += failures
    raise FileNotFoundError("Fashion-MNIST is not on this machine and could not be "
                            f"downloaded; tried: {'; '.join(tried)}. {HOW_TO_GET_IT}")


@contextlib.contextmanager
def exclusive_lock(path: Path, timeout_s: float) -> Iterator[None]:
    """Hold an exclusive `fcntl.flock` on `path` (created if absent) for the block.

    Every process on this machine that asks for it waits its turn, at most `timeout_s`;
    the kernel releases it when its holder exits, even killed, so a crashed download
    never blocks the next. TimeoutError names the file when the wait is longer."""
    deadline = time.monotonic() + timeout_s
    with open(path, "a") as handle:  # "a": never truncates what another process holds
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"waited {timeout_s:g} s for the lock {path}, held by another "
                        "process downloading Fashion-MNIST (`fuser` names it): let it "
                        f"finish, or set {CACHE_DIR_ENV} to another directory") from None
                time.sleep(LOCK_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write_text_atomically(path: Path, text: str) -> None:
    """`path` holds `text` or its previous content, never half of it."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as stream:
        stream.write(text)
    os.chmod(temporary, 0o644)  # mkstemp makes it private; it is public data
    os.replace(temporary, path)


# --------------------------------------------------------------------------- downloads

def download_into_cache(sources: list[tuple[str, Callable[[Path, float], str]]] | None = None,
                        budget_s: float = DOWNLOAD_BUDGET_S) -> list[str]:
    """Fetch the four .gz files from the first source that works, unpack them into the
    cache and record where they came from (`SOURCE_FILE`). Returns why each source tried
    before it failed (all of them when none worked).

    sources: (name, fetch(directory, deadline) -> the URL the files came from);
    default Debian's archive, then torchvision's mirrors. `deadline` (time.monotonic())
    bounds the time to reach a source, shared by all of them."""
    sources = sources if sources is not None else [
        ("Debian's archive", fetch_debian_package), ("torchvision's mirrors", fetch_torchvision)]
    deadline = time.monotonic() + budget_s
    failures = []
    cache_dir().mkdir(parents=True, exist_ok=True)
    for name, fetch in sources:
        if time.monotonic() >= deadline:
            failures.append(f"{name} (not tried: {budget_s:g} s to reach a source were spent)")
            continue
        with tempfile.TemporaryDirectory(dir=cache_dir()) as directory:
            try:
                url = fetch(Path(directory), deadline)
            except (OSError, ValueError, tarfile.TarError) as exc:  # network, checksum, format
                failures.append(f"{name} ({type(exc).__name__}: {exc})")
                logger.info("Fashion-MNIST from %s failed: %s", name, exc)
                continue
            _into_cache(Path(directory), gz=True)
        stamp = f"downloaded from {url} on {datetime.now(timezone.utc):%Y-%m-%d}"
        _write_text_atomically(_raw_dir(cache_dir()) / SOURCE_FILE, stamp + "\n")
        return failures
    return failures


def _get(url: str, deadline: float) -> bytes:
    """The body at `url`; the connection must open before `deadline` (at most
    CONNECT_TIMEOUT_S), and each read may stall that long."""
    timeout = max(0.1, min(CONNECT_TIMEOUT_S, deadline - time.monotonic()))
    request = urllib.request.Request(url, headers={"User-Agent": "tula-ray"})
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - http(s)
        return response.read()


def fetch_debian_package(directory: Path, deadline: float, *, mirror: str | None = None,
                         path: str = DEBIAN_PACKAGE_PATH,
                         sha256: str = DEBIAN_PACKAGE_SHA256) -> str:
    """Debian's dataset-fashion-mnist .deb from `mirror` (default $TULA_DEBIAN_MIRROR or
    deb.debian.org), checked against `sha256`; its four .gz files into `directory`.
    Returns the URL. ValueError when the download is not that package."""
    mirror = mirror or os.environ.get(DEBIAN_MIRROR_ENV) or DEBIAN_MIRROR_DEFAULT
    url = f"{mirror.rstrip('/')}/{path}"
    package = _get(url, deadline)
    digest = hashlib.sha256(package).hexdigest()
    if digest != sha256:
        raise ValueError(f"{url} has SHA-256 {digest}, not Debian's {sha256}")
    members = {f"{DEBIAN_FILES_IN_PACKAGE}{name}.gz": directory / f"{name}.gz"
               for name in IDX_FILES}
    with tarfile.open(fileobj=io.BytesIO(_ar_member(package, "data.tar")), mode="r:*") as data:
        for member in data.getmembers():
            if member.name in members and member.isfile():
                members.pop(member.name).write_bytes(data.extractfile(member).read())
    if members:
        raise ValueError(f"{url} lacks {sorted(members)}")
    return url


def _ar_member(archive: bytes, prefix: str) -> bytes:
    """The first member of a Unix `ar` archive (a .deb) whose name starts with `prefix`.
    Hand-written: the format is a 8-byte magic and 60-byte headers, and the one library
    that reads it (python-debian) would be a dependency for this alone."""
    if not archive.startswith(b"!<arch>\n"):
        raise ValueError("not a Debian package (no ar archive)")
    offset = 8
    while offset + 60 <= len(archive):
        header = archive[offset:offset + 60]
        name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58])
        start = offset + 60
        if name.startswith(prefix):
            return archive[start:start + size]
        offset = start + size + (size % 2)  # members are padded to an even offset
    raise ValueError(f"the Debian package has no {prefix}* member")


def fetch_torchvision(directory: Path, deadline: float) -> str:
    """The four .gz files from torchvision's mirrors of Fashion-MNIST, each checked
    against torchvision's md5. Returns the mirror's URL."""
    from torchvision.datasets import FashionMNIST  # imported only when it is needed

    errors = []
    for mirror in FashionMNIST.mirrors:
        try:
            for filename, md5 in FashionMNIST.resources:
                body = _get(f"{mirror}{filename}", deadline)
                if hashlib.md5(body).hexdigest() != md5:  # noqa: S324 - torchvision's check
                    raise ValueError(f"{mirror}{filename} does not match torchvision's md5")
                (directory / filename).write_bytes(body)
            return mirror
        except (OSError, ValueError) as exc:
            errors.append(f"{mirror}: {type(exc).__name__}: {exc}")
    raise OSError("; ".join(errors))
