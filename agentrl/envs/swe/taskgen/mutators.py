"""The mutators: each looks at one node inside a function and says which bugs it can make there.

A mutator takes a :class:`~agentrl.envs.swe.taskgen.source.Site` and yields changes: a description,
the text edits (on the exact span of the node, of the operator between its operands, or the whole
lines of a removed branch; the new text comes from the original source or from
:func:`ast.unparse`), and the same change as a rewrite of the node's AST, which
:func:`~agentrl.envs.swe.taskgen.candidates.mutate` uses to check the edits. :data:`MUTATORS`
names them all.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator

from agentrl.envs.swe.taskgen.source import (
    Change,
    Edit,
    Mutator,
    Operator,
    Rewrite,
    Site,
    Source,
    end,
    start,
)

# --- operators ---------------------------------------------------------------------------------

_TOKENS: dict[Operator, str] = {
    ast.Eq: r"==",
    ast.NotEq: r"!=",
    ast.Lt: r"(?<![<>=!])<(?![<=>])",
    ast.LtE: r"<=",
    ast.Gt: r"(?<![-<>=!])>(?![>=])",
    ast.GtE: r">=",
    ast.Is: r"\bis\b(?!\s+not\b)",
    ast.IsNot: r"\bis\s+not\b",
    ast.In: r"(?<!not )\bin\b",
    ast.NotIn: r"\bnot\s+in\b",
    ast.And: r"\band\b",
    ast.Or: r"\bor\b",
    ast.Add: r"\+",
    ast.Sub: r"-",
    ast.Mult: r"(?<!\*)\*(?!\*)",
    ast.FloorDiv: r"//",
}
_SPELLING: dict[Operator, str] = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.And: "and",
    ast.Or: "or",
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.FloorDiv: "//",
}
_FLIPPED: dict[Operator, Operator] = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Lt: ast.Gt,
    ast.Gt: ast.Lt,
    ast.LtE: ast.GtE,
    ast.GtE: ast.LtE,
}
_BOUNDARY: dict[Operator, Operator] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
}
_ARITHMETIC: dict[Operator, Operator] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv,
    ast.FloorDiv: ast.Mult,
}
_BOOLEAN: dict[Operator, Operator] = {ast.And: ast.Or, ast.Or: ast.And}


def _swap_operator(
    site: Site, left: ast.AST, right: ast.AST, old: Operator, new: Operator
) -> Edit | None:
    """The edit that replaces operator ``old`` between ``left`` and ``right`` by ``new``; None
    when the text between them does not hold exactly one such token (a comment in the way)."""
    gap = site.source.slice(end(left), start(right))
    pattern = re.compile(_TOKENS[old])
    if len(pattern.findall(gap)) != 1:
        return None
    return Edit(end(left), start(right), pattern.sub(_SPELLING[new], gap, count=1))


def _with_field(name: str, value: object) -> Rewrite:
    def rewrite(node: ast.AST) -> ast.AST:
        setattr(node, name, value)
        return node

    return rewrite


def _operator_change(table: dict[Operator, Operator]) -> Mutator:
    def mutator(site: Site) -> Iterator[Change]:
        node = site.node
        op: Operator
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            pairs, op, attr = [(node.left, node.comparators[0])], type(node.ops[0]), "ops"
        elif isinstance(node, ast.BoolOp):
            pairs, op, attr = (
                list(zip(node.values, node.values[1:], strict=False)),
                type(node.op),
                "op",
            )
        elif isinstance(node, ast.BinOp):
            pairs, op, attr = [(node.left, node.right)], type(node.op), "op"
        elif isinstance(node, ast.AugAssign):
            pairs, op, attr = [(node.target, node.value)], type(node.op), "op"
        else:
            return
        new = table.get(op)
        if new is None:
            return
        edits = [_swap_operator(site, left, right, op, new) for left, right in pairs]
        if all(edits):
            value: object = [new()] if attr == "ops" else new()
            description = f"{_SPELLING[op]!r} -> {_SPELLING[new]!r}"
            yield description, tuple(e for e in edits if e), _with_field(attr, value)

    return mutator


def _only(*types: type) -> Callable[[Mutator], Mutator]:
    """Restrict a mutator built from a table to some node types."""

    def wrap(mutator: Mutator) -> Mutator:
        def restricted(site: Site) -> Iterator[Change]:
            if isinstance(site.node, types):
                yield from mutator(site)

        return restricted

    return wrap


flip_comparison = _only(ast.Compare)(_operator_change(_FLIPPED))
comparison_boundary = _only(ast.Compare)(_operator_change(_BOUNDARY))
change_boolean_operator = _only(ast.BoolOp)(_operator_change(_BOOLEAN))
change_arithmetic_operator = _only(ast.BinOp, ast.AugAssign)(_operator_change(_ARITHMETIC))

# --- values ------------------------------------------------------------------------------------


def off_by_one_constant(site: Site) -> Iterator[Change]:
    """An integer literal n written in decimal becomes n + 1 or n - 1 (not below 0)."""
    node = site.node
    if not (isinstance(node, ast.Constant) and type(node.value) is int):
        return
    if not site.source.segment(node).isdigit():
        return
    for new in (node.value + 1, node.value - 1):
        if new >= 0:
            yield (
                f"{node.value} -> {new}",
                (Edit(start(node), end(node), str(new)),),
                _constant(new),
            )


def _constant(value: int | bool | None) -> Rewrite:
    return lambda node: ast.Constant(value)


_ATOMS = (ast.Name, ast.Attribute, ast.Call, ast.Subscript)


def off_by_one_bound(site: Site) -> Iterator[Change]:
    """A slice bound or a ``range()`` argument that is a name, attribute, call or subscript gets
    ``+ 1`` or ``- 1``."""
    node, parent = site.node, site.parent
    in_slice = isinstance(parent, ast.Slice) and node in (parent.lower, parent.upper)
    in_range = (
        isinstance(parent, ast.Call)
        and isinstance(parent.func, ast.Name)
        and parent.func.id == "range"
        and node in parent.args
    )
    if not (isinstance(node, _ATOMS) and (in_slice or in_range)):
        return
    text = site.source.segment(node)
    for op in (ast.Add, ast.Sub):
        new = f"{text} {_SPELLING[op]} 1"
        yield f"{text!r} -> {new!r}", (Edit(start(node), end(node), new),), _plus(op)


def _plus(op: Operator) -> Rewrite:
    return lambda node: ast.BinOp(node, op(), ast.Constant(1))  # type: ignore[arg-type]


def replace_return_value(site: Site) -> Iterator[Change]:
    """``return True``/``False`` is negated; any other returned value (not None) becomes None."""
    node = site.node
    if not isinstance(node, ast.Return) or node.value is None:
        return
    value = node.value
    if isinstance(value, ast.Constant) and value.value is None:
        return
    new = not value.value if isinstance(value, ast.Constant) and type(value.value) is bool else None
    text = repr(new)
    description = f"return {ast.unparse(value)[:40]!r} -> return {text}"
    yield (
        description,
        (Edit(start(value), end(value), text),),
        _with_field("value", ast.Constant(new)),
    )


def drop_negation(site: Site) -> Iterator[Change]:
    """``not x`` becomes ``x``."""
    node = site.node
    if not (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)):
        return
    text = site.source.segment(node)
    if not text.startswith("not"):
        return
    operand = text[3:].lstrip()
    yield f"{text[:40]!r} -> {operand[:40]!r}", (Edit(start(node), end(node), operand),), _operand


def _operand(node: ast.AST) -> ast.AST:
    assert isinstance(node, ast.UnaryOp)
    return node.operand


def swap_call_arguments(site: Site) -> Iterator[Change]:
    """The first two positional arguments of a call trade places."""
    node = site.node
    if not isinstance(node, ast.Call) or len(node.args) < 2:
        return
    first, second = node.args[:2]
    if isinstance(first, ast.Starred) or isinstance(second, ast.Starred):
        return
    a, b = site.source.segment(first), site.source.segment(second)
    if a == b:
        return
    edits = (Edit(start(first), end(first), b), Edit(start(second), end(second), a))
    yield f"({a[:30]}, {b[:30]}) -> ({b[:30]}, {a[:30]})", edits, _swap_first_arguments


def _swap_first_arguments(node: ast.AST) -> ast.AST:
    assert isinstance(node, ast.Call)
    args = node.args
    args[0], args[1] = args[1], args[0]
    return node


# --- branches ----------------------------------------------------------------------------------


def _whole_lines(source: Source, node: ast.AST, first_line: int, last_line: int) -> bool:
    """Whether lines ``first_line``..``last_line`` hold nothing but ``node`` (and comments)."""
    line, col = start(node)
    before = source.encoded[first_line - 1][: col if line == first_line else 0]
    after = source.encoded[last_line - 1][node.end_col_offset :].decode()  # type: ignore[attr-defined]
    return not before.strip() and (not after.strip() or after.strip().startswith("#"))


def _indent(source: Source, number: int) -> str:
    line = source.line(number)
    return line[: len(line) - len(line.lstrip())]


def remove_if_branch(site: Site) -> Iterator[Change]:
    """An ``if`` statement without ``else`` is deleted (``pass`` stays when it was alone)."""
    node, source = site.node, site.source
    if not isinstance(node, ast.If) or node.orelse or site.body is None:
        return
    first, last = node.lineno, node.end_lineno or node.lineno
    if not source.line(first)[node.col_offset :].startswith("if"):
        return  # an elif
    if not _whole_lines(source, node, first, last):
        return
    alone = len(site.body) == 1
    text = f"{_indent(source, first)}pass{_newline(source, last)}" if alone else ""
    rewrite: Rewrite = (lambda n: ast.Pass()) if alone else (lambda n: None)
    yield (
        f"removed if-branch of {ast.unparse(node.test)[:60]!r}",
        (Edit((first, 0), source.line_end(last), text),),
        rewrite,
    )


def remove_else_branch(site: Site) -> Iterator[Change]:
    """The ``else:`` block of an ``if`` (not an ``elif`` chain's inner link) is deleted."""
    node, source = site.node, site.source
    if not isinstance(node, ast.If) or not node.orelse:
        return
    first_else = node.orelse[0]
    if isinstance(first_else, ast.If) and source.line(first_else.lineno)[
        first_else.col_offset :
    ].startswith("elif"):
        return
    indent = _indent(source, node.lineno)
    body_end = node.body[-1].end_lineno or node.body[-1].lineno
    else_lines = [
        number
        for number in range(body_end + 1, first_else.lineno)
        if re.fullmatch(
            rf"{re.escape(indent)}else\s*:\s*(#.*)?", source.line(number).rstrip("\r\n")
        )
    ]
    last = node.orelse[-1]
    last_line = last.end_lineno or last.lineno
    if len(else_lines) != 1 or not _whole_lines(source, last, last.lineno, last_line):
        return
    yield (
        f"removed else-branch of {ast.unparse(node.test)[:60]!r}",
        (Edit((else_lines[0], 0), source.line_end(last_line), ""),),
        _with_field("orelse", []),
    )


def _newline(source: Source, number: int) -> str:
    line = source.line(number)
    return line[len(line.rstrip("\r\n")) :]


MUTATORS: dict[str, Mutator] = {
    "flip_comparison": flip_comparison,
    "comparison_boundary": comparison_boundary,
    "change_boolean_operator": change_boolean_operator,
    "change_arithmetic_operator": change_arithmetic_operator,
    "off_by_one_constant": off_by_one_constant,
    "off_by_one_bound": off_by_one_bound,
    "replace_return_value": replace_return_value,
    "drop_negation": drop_negation,
    "swap_call_arguments": swap_call_arguments,
    "remove_if_branch": remove_if_branch,
    "remove_else_branch": remove_else_branch,
}
