"""`ignition-server`: wires the pieces together. Nothing imports this package.

`parser.py` the flags, `settings.py` the flags as the settings object, and a module per
command (`serve`, `render`, `userdata`, `cache`, `base`), each with its `run(args)`.
Exit codes: 0 done, 1 failed at run time, 2 bad usage or configuration.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

from .parser import build_parser

EXIT_FAILED, EXIT_USAGE = 1, 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve" and args.fips:
        from ..tls.fips import reexec_with_fips_openssl

        reexec_with_fips_openssl(list(argv) if argv is not None else sys.argv[1:])
    try:
        return _command(args.command)(args)
    except LookupError as exc:
        print(f"ignition-server {args.command}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except ValueError as exc:
        print(f"ignition-server {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 0


def _command(name: str) -> Callable[[argparse.Namespace], int]:
    # Imported when chosen: `cache stats` need not load the server, nor `serve` the importer.
    if name == "serve":
        from .serve import run
    elif name == "render":
        from .render import run
    elif name == "userdata":
        from .userdata import run
    elif name == "cache":
        from .cache import run
    else:
        from .base import run
    return run
