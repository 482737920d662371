"""MkDocs hook: the command-line reference, generated from the command's own argparse parser."""

from __future__ import annotations

import argparse
from typing import Any

MARKER = "<!-- cli-help -->"


def cli_reference() -> str:
    """Markdown of ``profcallbacks --help`` and of each subcommand's ``--help``."""
    from profcallbacks.cli import build_parser

    parser = build_parser()
    parts = ["## `profcallbacks`\n", "```text\n" + parser.format_help() + "```\n"]
    for action in parser._actions:  # argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                parts += [f"## `profcallbacks {name}`\n", "```text\n" + sub.format_help() + "```\n"]
    return "\n".join(parts)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return markdown.replace(MARKER, cli_reference()) if MARKER in markdown else markdown
