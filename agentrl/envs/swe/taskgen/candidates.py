"""Finding the bugs the mutators can make in a module, and making one.

:func:`find_candidates` walks the bodies of a module's functions and asks each mutator in
:data:`~agentrl.envs.swe.taskgen.mutators.MUTATORS` for the rewrites it can make there.
:func:`mutate` applies a :class:`Candidate`'s text edits and checks that the result parses to the
function with the candidate's AST rewrite and nothing else (so precedence or a comment in the way
cannot make a different change than the one recorded); a candidate that fails the check is not
used.

Only code inside functions is changed: not module or class level statements, decorators,
defaults or annotations, nor anything inside f-strings.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Iterator
from dataclasses import dataclass, field

from agentrl.envs.swe.taskgen.mutators import MUTATORS
from agentrl.envs.swe.taskgen.source import Edit, NodeKey, Rewrite, Site, Source, node_key, start


class MutationError(ValueError):
    """A candidate's text edits do not produce the rewrite it records."""


@dataclass(frozen=True, eq=False)
class Candidate:
    """One possible bug: a rewrite of one node inside one function."""

    kind: str
    """The mutator's name, e.g. ``"flip_comparison"``."""
    function: str
    """Qualified name of the innermost function holding the node."""
    line: int
    end_line: int
    description: str
    """What changes, e.g. ``"'<' -> '<='"`` (for metadata, never for problem statements)."""
    edits: tuple[Edit, ...]
    target: NodeKey
    rewrite: Rewrite = field(repr=False)
    """Applied to a copy of the target node: the node that replaces it, or None to delete it."""
    scope: ast.FunctionDef | ast.AsyncFunctionDef = field(repr=False)


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
# Fields never visited: decorators, signatures (defaults, annotations), class bases and keywords.
_ONLY_BODY = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_Scope = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
_SKIPPED = {ast.Lambda: "args", ast.AnnAssign: "annotation", ast.arg: "annotation"}


def _children(node: ast.AST) -> Iterator[tuple[ast.AST, list[ast.stmt] | None]]:
    """Each child node to visit, with the statement list that holds it (None for expressions)."""
    for name, value in ast.iter_fields(node):
        if (isinstance(node, _ONLY_BODY) and name != "body") or _SKIPPED.get(type(node)) == name:
            continue
        if isinstance(value, list):
            body = value if value and isinstance(value[0], ast.stmt) else None
            yield from ((child, body) for child in value if isinstance(child, ast.AST))
        elif isinstance(value, ast.AST):
            yield value, None


def find_candidates(text: str, kinds: list[str] | None = None) -> list[Candidate]:
    """Every rewrite the mutators named in ``kinds`` (default: all) can make inside the
    functions of the module ``text``, in source order."""
    source = Source(text)
    mutators = [(kind, MUTATORS[kind]) for kind in (kinds or MUTATORS)]
    candidates: list[Candidate] = []

    def visit(
        node: ast.AST, parent: ast.AST, body: list[ast.stmt] | None, scope: list[_Scope]
    ) -> None:
        if isinstance(node, ast.JoinedStr):
            return
        functions = [s for s in scope if isinstance(s, _FUNCTIONS)]
        key = node_key(node)
        if functions and key is not None:
            name = ".".join(s.name for s in scope)
            site = Site(source, node, parent, body, name)
            for kind, mutator in mutators:
                for description, edits, rewrite in mutator(site):
                    candidates.append(
                        Candidate(
                            kind=kind,
                            function=name,
                            line=key[1],
                            end_line=key[3],
                            description=description,
                            edits=edits,
                            target=key,
                            rewrite=rewrite,
                            scope=functions[-1],
                        )
                    )
        inner = [*scope, node] if isinstance(node, _ONLY_BODY) else scope
        for child, child_body in _children(node):
            visit(child, node, child_body, inner)

    tree = ast.parse(text)
    for statement in tree.body:
        visit(statement, tree, tree.body, [])
    return candidates


class _Apply(ast.NodeTransformer):
    """Replaces the node whose key is ``key`` by ``rewrite(node)`` (None deletes it)."""

    def __init__(self, key: NodeKey, rewrite: Rewrite) -> None:
        self.key, self.rewrite = key, rewrite

    def visit(self, node: ast.AST) -> ast.AST | None:
        if node_key(node) == self.key:
            return self.rewrite(node)
        return self.generic_visit(node)


def mutate(text: str, candidate: Candidate) -> str:
    """The module ``text`` with ``candidate`` applied. Raises :class:`MutationError` unless the
    result parses to the original function with the candidate's rewrite (and nothing else)."""
    mutated = Source(text).apply(candidate.edits)
    try:
        tree = ast.parse(mutated)
    except SyntaxError as exc:
        raise MutationError(f"{candidate.kind} at line {candidate.line}: {exc}") from None
    expected = _Apply(candidate.target, candidate.rewrite).visit(copy.deepcopy(candidate.scope))
    key = start(candidate.scope)
    actual = next(
        (node for node in ast.walk(tree) if isinstance(node, _FUNCTIONS) and start(node) == key),
        None,
    )
    if actual is None or expected is None or ast.dump(actual) != ast.dump(expected):
        raise MutationError(f"{candidate.kind} at line {candidate.line} changes more than its node")
    return mutated
