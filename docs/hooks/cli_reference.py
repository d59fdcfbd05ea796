"""A MkDocs hook: the command-line reference, generated from the `tula-ray` parser.

`docs/reference/cli.md` holds the marker below; the build replaces it with one section per
subcommand of `tula_ray.cli.command.build_parser()`, each with its `--help`, so the page
lists every subcommand and option the installed command has, and nothing else.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

MARKER = "<!-- cli-reference -->"
PAGE = "reference/cli.md"
HELP_COLUMNS = 92  # the width argparse wraps the help text to


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommands of `parser`, by name, in the order `--help` lists them."""
    for action in parser._actions:  # argparse keeps its subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def summaries(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each subcommand's one-line help, as `tula-ray --help` shows it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {choice.dest: choice.help or "" for choice in action._choices_actions}
    return {}


def cli_reference_markdown() -> str:
    """One section for `tula-ray`, then one per subcommand, each with its help text."""
    from tula_ray.cli.command import build_parser

    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(HELP_COLUMNS)
    try:
        parser = build_parser()
        sections = [f"## `tula-ray` {{#tula-ray}}\n\n```text\n{parser.format_help()}```\n"]
        helps = summaries(parser)
        for name, command in subcommands(parser).items():
            sections.append(f"## `tula-ray {name}` {{#tula-ray-{name}}}\n\n{helps.get(name, '')}"
                            f"\n\n```text\n{command.format_help()}```\n")
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before
    return "\n".join(sections)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"docs/{PAGE} lost its {MARKER} marker")
    return markdown.replace(MARKER, cli_reference_markdown())
