"""``python -m attnlib.bench``: see :mod:`attnlib.bench.cli`, or run it with ``--help``."""

from .cli import main

raise SystemExit(main())
