"""The `tula-ray` command (tula_ray.cli.command has its usage).

  command     the parser and `main`, the console script's entry point;
  options     the options the commands share;
  commands    what each command runs (Ray and torch imported only there);
  extensions  `--import`: a user's extension modules, imported first.
"""

from tula_ray.cli.command import build_parser, main

__all__ = ["build_parser", "main"]
