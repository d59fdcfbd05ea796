"""A MkDocs hook: the figures BENCHMARKS.md shows, served beside the benchmarks page.

`docs/benchmarks.md` includes BENCHMARKS.md itself, whose images are paths from the
repository root (`benchmarks/results/*.png`, written by the benchmarks). This adds exactly
those files to the site at the same paths, so the links resolve; an image that is missing
stays a broken link, which `mkdocs build --strict` reports.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
SOURCE = "BENCHMARKS.md"


def figures(root: Path) -> list[str]:
    """The relative image paths BENCHMARKS.md links to, in order."""
    text = (root / SOURCE).read_text()
    return [path for path in IMAGE.findall(text) if "://" not in path]


def on_files(files: Files, config: Any, **kwargs: Any) -> Files:
    root = Path(config.config_file_path).parent
    for path in figures(root):
        if (root / path).is_file() and files.get_file_from_path(path) is None:
            files.append(File(path, src_dir=str(root), dest_dir=config.site_dir,
                              use_directory_urls=config.use_directory_urls))
    return files
