"""`python -m tula_ray.cli`: the `tula-ray` command."""

import sys

from tula_ray.cli.command import main

sys.exit(main())
