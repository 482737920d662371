"""The ``profcallbacks`` command line."""

from __future__ import annotations

import argparse
import sys

from profcallbacks._version import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="profcallbacks",
        description="Summarise profcallbacks log directories: traces, step times and findings.",
    )
    parser.add_argument("--version", action="version", version=f"profcallbacks {__version__}")
    parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
