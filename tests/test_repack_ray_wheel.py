"""Ray's wheel repacked without its Java jars (issue 46, item 3), on a small made-up wheel."""

import zipfile

import pytest

from benchmarks.gpu.repack_ray_wheel import repack

RECORD = "ray-2.60.0.dist-info/RECORD"
VENDORED_RECORD = "ray/_private/thirdparty/pkg-1.0.dist-info/RECORD"


def _wheel(path):
    files = {"ray/__init__.py": "print('ray')\n", "ray/jars/ray_dist.jar": "J" * 4000,
             "ray/jars/other.jar": "K", "ray/_private/runtime_env/java_jars.py": "jars = 1\n",
             VENDORED_RECORD: "ray/jars/kept-in-a-vendored-record,,\n",
             "ray-2.60.0.dist-info/METADATA": "Name: ray\n"}
    lines = [f"{name},sha256=x,{len(text)}\n" for name, text in files.items()] + [f"{RECORD},,\n"]
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
        wheel.writestr(RECORD, "".join(lines))
    return path


def test_the_repacked_wheel_lacks_the_jars_and_their_record_lines_and_keeps_the_rest(tmp_path):
    original = _wheel(tmp_path / "ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl")
    repacked = repack(original, tmp_path / "out")
    assert repacked.name == original.name  # pip reads the tags from the name
    with zipfile.ZipFile(original) as before, zipfile.ZipFile(repacked) as after:
        assert sorted(after.namelist()) == sorted(
            name for name in before.namelist() if not name.startswith("ray/jars/"))
        record = after.read(RECORD).decode().splitlines()
        assert [line.split(",")[0] for line in record] == [
            "ray/__init__.py", "ray/_private/runtime_env/java_jars.py", VENDORED_RECORD,
            "ray-2.60.0.dist-info/METADATA", RECORD]
        for name in after.namelist():  # every other file byte for byte
            if name != RECORD:
                assert after.read(name) == before.read(name), name
    assert repacked.stat().st_size < original.stat().st_size


def test_what_is_not_a_wheel_is_refused_by_name(tmp_path):
    not_zip = tmp_path / "ray.whl"
    not_zip.write_text("not a zip")
    with pytest.raises(ValueError, match="is not a wheel"):
        repack(not_zip, tmp_path / "out")
    wheel = _wheel(tmp_path / "ray-2.60.0-py3-none-any.whl")
    with pytest.raises(ValueError, match="holds the wheel itself"):
        repack(wheel, tmp_path)
    no_record = tmp_path / "bare-1.0-py3-none-any.whl"
    with zipfile.ZipFile(no_record, "w") as bare:
        bare.writestr("bare/__init__.py", "")
    with pytest.raises(ValueError, match="0 top-level RECORD"):
        repack(no_record, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing half-written
