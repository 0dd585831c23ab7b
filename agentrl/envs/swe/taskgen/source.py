"""Module text addressed the way :mod:`ast` addresses it, and the types the mutators share.

Positions are (line from 1, column in UTF-8 bytes), as ``ast`` nodes report them. :class:`Source`
slices the text at such positions and applies :class:`Edit` s to it; lines keep their endings
(``\n``, ``\r\n`` or ``\r``), so the text outside the edits stays byte-identical.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

# (type name, lineno, col_offset, end_lineno, end_col_offset): identifies a node in a module.
NodeKey = tuple[str, int, int, int, int]
Position = tuple[int, int]  # (line from 1, column in UTF-8 bytes), as ast reports them
Rewrite = Callable[[ast.AST], ast.AST | None]
Operator = type[ast.AST]  # ast.Eq, ast.And, ast.Add ...

_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")


@dataclass(frozen=True)
class Edit:
    """Replace the text from ``start`` to ``end`` with ``text``."""

    start: Position
    end: Position
    text: str


class Source:
    """A module's text split into lines (line endings kept), addressed as ast addresses them."""

    def __init__(self, text: str) -> None:
        self.lines = _LINE.findall(text)
        self.encoded = [line.encode() for line in self.lines]

    def line(self, number: int) -> str:
        return self.lines[number - 1]

    def slice(self, start: Position, end: Position) -> str:
        (l1, c1), (l2, c2) = start, end
        if l1 == l2:
            return self.encoded[l1 - 1][c1:c2].decode()
        middle = b"".join(self.encoded[l1 : l2 - 1])
        return (self.encoded[l1 - 1][c1:] + middle + self.encoded[l2 - 1][:c2]).decode()

    def segment(self, node: ast.AST) -> str:
        return self.slice(start(node), end(node))

    def line_end(self, number: int) -> Position:
        """The position just past line ``number``, its line ending included."""
        return (number, len(self.encoded[number - 1]))

    def apply(self, edits: tuple[Edit, ...]) -> str:
        """The text with ``edits`` (non-overlapping, on this text's positions) applied."""
        encoded = list(self.encoded)
        for edit in sorted(edits, key=lambda e: e.start, reverse=True):
            (l1, c1), (l2, c2) = edit.start, edit.end
            joined = encoded[l1 - 1][:c1] + edit.text.encode() + encoded[l2 - 1][c2:]
            encoded[l1 - 1 : l2] = [joined]
        return b"".join(encoded).decode()


def start(node: ast.AST) -> Position:
    return (node.lineno, node.col_offset)  # type: ignore[attr-defined]


def end(node: ast.AST) -> Position:
    return (node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]


def node_key(node: ast.AST) -> NodeKey | None:
    if getattr(node, "end_lineno", None) is None:
        return None
    return (type(node).__name__, *start(node), *end(node))


@dataclass(frozen=True)
class Site:
    """Where a node sits: the source, the node's parent, the statement list holding it (for
    statements) and the qualified name of its function."""

    source: Source
    node: ast.AST
    parent: ast.AST
    body: list[ast.stmt] | None
    function: str


Change = tuple[str, tuple[Edit, ...], Rewrite]  # (description, edits, rewrite)
Mutator = Callable[[Site], Iterator[Change]]
