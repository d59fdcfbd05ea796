"""The documentation: README as a front page, the MkDocs site built with --strict, a
reference entry for every public name and every `tula-ray` subcommand, and every Python
block of README.md and docs/ run as printed.

A Python block's marker is an HTML comment on the line right before its opening fence
(docs/index.md, "Code blocks in these pages"):
  <!-- fragment -->  not run: a piece of a larger program, or one that needs a cluster;
  <!-- ray -->       run in a local Ray session (Ray-marked): README's driver;
  none              run here, fast, offline and without Ray.
Each block runs alone, in a fresh module and an empty working directory.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tula_ray
from tula_ray.cli.command import build_parser

from docs_blocks import BLOCKS, DOCS, FRAGMENT, RAY, RAY_BLOCKS, README, ROOT, RUNNABLE, run_block

README_MAX_LINES, README_MAX_LINE_CHARS = 200, 100  # the front page
COMMAND_MARKERS = ("main-command", "test-command")  # .ci/run reads the test command
ENTRY = re.compile(r"^:::\s+(\S+)", re.MULTILINE)  # a mkdocstrings entry
BUILD_TIMEOUT_S = 300


# --- README as a front page ---------------------------------------------------------

def test_readme_is_a_short_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    long = [(number, len(line)) for number, line in enumerate(lines, 1)
            if len(line) > README_MAX_LINE_CHARS]
    assert not long, f"README.md lines over {README_MAX_LINE_CHARS} characters: {long}"


@pytest.mark.parametrize("marker", COMMAND_MARKERS)
def test_readme_keeps_its_command_between_markers(marker):
    """Each command is one bash line in a fence between its markers, as .ci/run reads it."""
    lines = README.read_text().splitlines()
    assert lines.count(f"<!-- {marker} -->") == 1 and lines.count(f"<!-- /{marker} -->") == 1
    start, end = lines.index(f"<!-- {marker} -->"), lines.index(f"<!-- /{marker} -->")
    fenced = lines[start + 1:end]
    assert len(fenced) == 3 and fenced[0] == "```bash" and fenced[2] == "```", fenced
    assert fenced[1].startswith("python3 -m venv .venv && .venv/bin/pip install -e ")


def test_only_readmes_driver_needs_ray():
    assert [block.path for block in RAY_BLOCKS] == [README]


def test_every_marker_is_known():
    unknown = [(block.id, block.marker) for block in BLOCKS
               if block.marker not in (None, FRAGMENT, RAY)]
    assert not unknown, f"unknown markers before ```python blocks: {unknown}"


# --- the site ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """`mkdocs build --strict` of the repository's mkdocs.yml, into a temporary folder."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT_S)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return out


def test_mkdocs_build_is_strict(site):
    # mkdocs.yml has MkDocs' own YAML tags (!relative): read the one line.
    assert re.search(r"^strict: true$", (ROOT / "mkdocs.yml").read_text(), re.MULTILINE)
    assert (site / "index.html").is_file() and (site / "benchmarks" / "index.html").is_file()


def test_benchmarks_page_is_benchmarks_md_with_its_figures(site):
    """docs/benchmarks.md includes BENCHMARKS.md (not a copy); its images are served."""
    assert '--8<-- "BENCHMARKS.md"' in (DOCS / "benchmarks.md").read_text()
    page = (site / "benchmarks" / "index.html").read_text()
    titles = re.findall(r"^#+ (.+)$", (ROOT / "BENCHMARKS.md").read_text(), re.MULTILINE)
    assert titles and all(_text(title) in _text(page) for title in titles[:5])
    for image in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", (ROOT / "BENCHMARKS.md").read_text()):
        assert (site / image).is_file(), f"{image} (linked from BENCHMARKS.md) is not served"


def _text(html: str) -> str:
    """Words only: no tags, entities, code marks or spacing."""
    plain = re.sub(r"<[^>]+>|&\w+;|&#\d+;|[`*]", " ", html)
    return " ".join(re.sub(r"[^\w%.,:=()-]+", " ", plain).split())


# --- the reference -----------------------------------------------------------------

def reference_entries() -> list[str]:
    return [entry for path in sorted((DOCS / "reference").glob("*.md"))
            for entry in ENTRY.findall(path.read_text())]


def resolve(identifier: str) -> object:
    """The object a dotted identifier names at import time: a module's attribute, or a
    module."""
    parts = identifier.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[split:]:
            obj = getattr(obj, attribute)
        return obj
    raise ImportError(identifier)


@pytest.mark.parametrize("name", tula_ray.__all__)
def test_every_public_name_has_a_reference_entry(name, site):
    """Found by its public name (`::: tula_ray.NAME`), so that moving its module changes
    nothing in the docs; and rendered under that name in the built site."""
    assert f"tula_ray.{name}" in reference_entries()
    obj = getattr(tula_ray, name)
    # The griffe extension (docs/hooks/public_names.py) documents the name from where the
    # object is defined: that place must hold this very object.
    assert resolve(f"{obj.__module__}.{obj.__qualname__}") is obj
    rendered = "".join(path.read_text() for path in (site / "reference").rglob("*.html"))
    assert f'id="tula_ray.{name}"' in rendered


def test_every_reference_entry_resolves():
    for entry in reference_entries():
        resolve(entry)  # raises if the name is gone


def subcommands() -> dict[str, argparse.ArgumentParser]:
    """The parser's subcommands, read from the parser itself (no list kept here)."""
    return next(action for action in build_parser()._actions
                if isinstance(action, argparse._SubParsersAction)).choices


SUBCOMMANDS = sorted(subcommands())


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_has_a_reference_entry(command, site):
    """docs/reference/cli.md, generated from the parser at build time: a section per
    subcommand with every option of its --help."""
    page = (site / "reference" / "cli" / "index.html").read_text()
    assert f'id="tula-ray-{command}"' in page
    section = page[page.index(f'id="tula-ray-{command}"'):]
    section = section[:section.find("<h2", 1)] if "<h2" in section[1:] else section
    for action in subcommands()[command]._actions:
        for option in action.option_strings:
            assert option in section, f"tula-ray {command}: {option} is not in its section"


# --- the code blocks ---------------------------------------------------------------

@pytest.mark.parametrize("block", RUNNABLE, ids=lambda block: block.id)
def test_python_block_runs(block, tmp_path, monkeypatch, registries):
    """Fast, offline, no Ray; registrations it makes are undone after it."""
    monkeypatch.chdir(tmp_path)
    run_block(block)


@pytest.mark.ray
def test_readmes_driver_runs_as_printed(readme_driver):
    """README's driver: its own Workload searched, the plan read, the choice trained to an
    accuracy (issue 43: it stops at the target, within an epoch here), on the run's shared Ray (which `ray_session()` in the block joins); run once
    for the whole run (conftest.py's `readme_driver`: tests/test_search_ray.py examines its
    plan). Each block is a test of its own in the fast part."""
    printed, cwd = readme_driver["printed"], readme_driver["cwd"]
    assert "choice (time): N=" in printed and "chose N=" in printed
    assert "test_accuracy" in printed
    assert (cwd / "plan" / "plan.json").is_file()
    plan, result = readme_driver["namespace"]["plan"], readme_driver["namespace"]["result"]
    # search's default output (verbose=1): a line per candidate, not Tune's boxes
    candidates = [line for line in printed.splitlines() if line.startswith("  [")]
    assert len(candidates) == len(plan.profiles) and "Trial status" not in printed
    assert max(len(line) for line in plan.summary().splitlines()) <= 100
    assert (result.num_workers, result.global_batch) == (plan.choice.num_workers,
                                                         plan.choice.global_batch)
    assert result.target["target_reached"] and result.target["time_to_target_s"] > 0
    assert result.metrics["val_accuracy"].iloc[-1] >= 0.9 and len(result.metrics) < 3
    assert "'target_reached': True" in printed


def test_the_custom_workload_example_is_a_workload_that_trains():
    """examples/custom_workload.py, README's driver with a command line: its model and data
    pass the check `search` runs on a worker first (a step trained on its first samples),
    here in this process; its run on Ray is README's driver's (above)."""
    import runpy

    from tula_ray.workloads import Workload
    from tula_ray.workloads.check import checked

    example = runpy.run_path(str(ROOT / "examples" / "custom_workload.py"))
    workload = checked(Workload("rgb-cnn", model_fn=example["model"],
                                train_dataset_fn=example["train_data"],
                                test_dataset_fn=example["test_data"]))
    assert workload.sample_shape == (3, 16, 16) and workload.num_classes == 3
