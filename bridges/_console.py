"""The ``memstrata`` console script (and ``python -m memstrata``): when the arguments name the
query command, the helper that loads its model (:mod:`._query_model`) is forked before the
command line is imported, then the command line runs as always."""

from __future__ import annotations

import sys

__all__ = ["main"]


def main() -> None:
    """Console-script entry point."""
    try:
        from ._query_model import start_early

        start_early(sys.argv[1:])
        from .cli import main as run

        run()
    except KeyboardInterrupt:  # Ctrl-C before the command line runs (its import: ~0.2 s of a query)
        sys.stderr.write("\nmemstrata: interrupted\n")  # as the command line words it
        sys.exit(130)
