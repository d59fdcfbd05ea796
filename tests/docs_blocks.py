"""The Python blocks of README.md and docs/, and running one as a script of its own: for
tests/test_docs.py, and for the run's one execution of README's driver (conftest.py's
`readme_driver`, whose plan tests/test_search_ray.py examines too).

A Python block's marker is an HTML comment on the line right before its opening fence
(docs/index.md, "Code blocks in these pages"):
  <!-- fragment -->  not run: a piece of a larger program, or one that needs a cluster;
  <!-- ray -->       run in a local Ray session (Ray-marked): README's driver;
  none              run here, fast, offline and without Ray.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
FRAGMENT, RAY = "fragment", "ray"
OPENING = re.compile(r"^(\s*)```python\s*$")
COMMENT = re.compile(r"^\s*<!--\s*(.*?)\s*-->\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    """One ```python block of a Markdown file."""

    path: Path
    line: int  # of its first line of code, 1-based
    marker: str | None  # the comment on the line before its fence, if any
    code: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def python_blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    blocks, index = [], 0
    while index < len(lines):
        opening = OPENING.match(lines[index])
        if not opening:
            index += 1
            continue
        comment = COMMENT.match(lines[index - 1]) if index > 0 else None
        end = index + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if end == len(lines):
            raise ValueError(f"{path}:{index + 1}: a ```python block is never closed")
        indent = len(opening.group(1))
        code = "\n".join(line[indent:] for line in lines[index + 1:end])
        blocks.append(Block(path, index + 2, comment.group(1) if comment else None, code))
        index = end + 1
    return blocks


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


BLOCKS = [block for path in markdown_files() for block in python_blocks(path)]
RUNNABLE = [block for block in BLOCKS if block.marker is None]
RAY_BLOCKS = [block for block in BLOCKS if block.marker == RAY]


def run_block(block: Block, *, by_value: bool = False) -> dict:
    """Execute the block as a script of its own: a fresh module, line numbers as in the
    Markdown file; returns its namespace. by_value: its functions travel to Ray workers by
    value, as a driver script's do (Ray workers cannot import the module)."""
    name = "docs_block_" + re.sub(r"\W", "_", block.id)
    module = types.ModuleType(name)
    sys.modules[name] = module
    cloudpickle = None
    if by_value:
        from ray import cloudpickle  # Ray serialises functions with its own copy

        cloudpickle.register_pickle_by_value(module)
    try:
        code = compile("\n" * (block.line - 1) + block.code, str(block.path), "exec")
        exec(code, module.__dict__)
        return module.__dict__
    finally:
        if cloudpickle is not None:
            cloudpickle.unregister_pickle_by_value(module)
        sys.modules.pop(name, None)
