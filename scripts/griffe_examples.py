"""Griffe extension for the docs: this project's ``Example:`` docstring sections are rendered as
Google-style ``Examples:`` (doctest code), which is what they are."""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:[ \t]*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    def on_object(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
