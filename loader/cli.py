"""The ``loader`` command: parse arguments and call library code (no logic of its own)."""

from __future__ import annotations

import argparse
import sys

from loader import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loader", description="A data-loading service for ML training.")
    parser.add_argument("--version", action="version", version=f"loader {__version__}")
    parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
