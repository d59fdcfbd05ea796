"""Ray's wheel without its Java jars, for a GPU image with torch but no Ray and no internet
(issue 46, item 3; the recipe is on docs/guide/cluster.md's GPU page).

Ray's cp312 manylinux wheel carries `ray/jars/ray_dist.jar` (31 MB of its 79 MB), for Ray's
Java workers; Python never loads it. This writes the wheel again without `ray/jars/*` and
without their lines in the wheel's RECORD (pip checks every file it installs against
RECORD, and a line naming a missing file is harmless but untrue), so `pip install
--target DIR repacked.whl` installs what Python uses.

    python -m benchmarks.gpu.repack_ray_wheel ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl OUT_DIR
"""

from __future__ import annotations

import argparse
import zipfile
from pathlib import Path

DROPPED_PREFIX = "ray/jars/"  # the Java jars: no Python code reads them


def _is_record(name: str) -> bool:
    """The wheel's own RECORD, at its top level (Ray vendors packages whose dist-info
    directories lie deeper, with RECORDs of their own that pip does not read)."""
    parts = name.split("/")
    return len(parts) == 2 and parts[0].endswith(".dist-info") and parts[1] == "RECORD"


def kept_record(text: str) -> str:
    """RECORD's lines (path,hash,size as CSV; paths without commas in Ray's wheel) less
    those of the dropped files."""
    return "".join(line for line in text.splitlines(keepends=True)
                   if not line.startswith(DROPPED_PREFIX))


def repack(wheel: Path, out_dir: Path) -> Path:
    """Writes `wheel` again under `out_dir` (same file name: pip reads its tags from it)
    without the files under ray/jars/ and their RECORD lines; returns the new path."""
    if wheel.suffix != ".whl" or not zipfile.is_zipfile(wheel):
        raise ValueError(f"wheel={str(wheel)!r} is not a wheel (a zip file named *.whl)")
    target = out_dir / wheel.name
    if target.resolve() == wheel.resolve():
        raise ValueError(f"out_dir={str(out_dir)!r} holds the wheel itself: choose another "
                         "directory, the original is read while the new one is written")
    with zipfile.ZipFile(wheel) as source:
        records = [info for info in source.infolist() if _is_record(info.filename)]
    if len(records) != 1:
        raise ValueError(f"wheel={str(wheel)!r} has {len(records)} top-level RECORD files; a "
                         "wheel has exactly one (NAME-VERSION.dist-info/RECORD)")
    out_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as source, \
            zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as repacked:
        for info in source.infolist():
            if info.filename.startswith(DROPPED_PREFIX):
                continue
            data = source.read(info)
            if _is_record(info.filename):
                data = kept_record(data.decode()).encode()
            repacked.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path, help="the wheel pip downloaded")
    parser.add_argument("out_dir", type=Path, help="where the repacked wheel goes")
    args = parser.parse_args(argv)
    target = repack(args.wheel, args.out_dir)
    mb = 1e6
    print(f"{target}: {target.stat().st_size / mb:.1f} MB "
          f"(from {args.wheel.stat().st_size / mb:.1f} MB)")


if __name__ == "__main__":
    main()
