"""PrefixCache: finished sequences' KV, kept under a token budget and found by token prefix.

What is cached. An entry is a token sequence ``t_0 .. t_{n-1}`` and the ``(layers, 2, H, n, D)``
keys and values a model computed for it (the layout of `DecodeBatch.row_kv`). Attention is causal
and positions start at 0, so the KV of the first ``m`` tokens is a function of those ``m`` tokens
alone: an entry serves every sequence that shares its first ``m`` tokens, for any ``m <= n``. A
lookup therefore returns the longest common prefix over all entries, not only whole entries; two
episodes that share a system prompt share its KV.

Lookup. The match is found by comparing token ids and nothing else. A ``session_id`` is only a
hint: when the session's latest entry is a prefix of the query (the usual next turn of a
conversation), it is returned without scanning the other entries. The answer is the same either
way: no entry is a prefix of another (see below), so no entry can share more tokens with the query
than one that is a whole prefix of it. At least one token of the query is always left uncached,
because the caller needs the logits that computing it produces.

Memory bound. The entries hold at most ``max_tokens`` tokens in all (``0`` disables the cache);
inserting evicts least-recently-used entries (a hit counts as a use) until the new one fits, and
an entry longer than the budget is not stored. An entry that is a prefix of another is redundant
(the longer one serves every query it would) and is dropped, so a session's turns replace one
another instead of piling up. ``release`` forgets a session that will make no more requests: its
latest entry is dropped unless another session's latest entry is the same one (a prefix shared
with other sessions, such as a system prompt, is still held by their entries). A token costs
``2 * layers * kv_heads * head_dim * dtype bytes`` (46 KB for SmolLM2-135M in float32);
``nbytes`` reports what is held.

Not covered: which weights computed an entry. The owner clears the cache whenever the weights
change (`LocalEngine.update_weights` does). Hits are views of the stored tensors; callers copy
them (`DecodeBatch.prefill` does) and must not modify them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

_CHUNK = 64  # tokens compared per slice before falling back to one at a time


@dataclass(frozen=True)
class PrefixHit:
    """The longest cached prefix of a query."""

    length: int
    """How many leading tokens of the query are cached (``>= 1``)."""
    kv: torch.Tensor
    """Their keys and values, ``(layers, 2, H, length, D)``; a read-only view of the entry."""


@dataclass(eq=False)
class _Entry:
    tokens: tuple[int, ...]
    kv: torch.Tensor  # (layers, 2, H, n, D)
    sessions: set[str] = field(default_factory=set)  # sessions whose latest entry this is


class PrefixCache:
    """A token-budgeted LRU store of KV by token sequence; see the module docstring."""

    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0 (0 disables the cache), got {max_tokens}")
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()  # LRU first
        self._sessions: dict[str, tuple[int, ...]] = {}  # session id -> its latest entry's key
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        """Tokens held by all entries together (never more than ``max_tokens``)."""
        return self._tokens

    def sequences(self) -> list[tuple[int, ...]]:
        """The entries' token ids, least recently used first."""
        return list(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes held by the entries' tensors."""
        return sum(e.kv.numel() * e.kv.element_size() for e in self._entries.values())

    def lookup(self, ids: Sequence[int], session_id: str | None = None) -> PrefixHit | None:
        """The longest cached prefix of ``ids`` that leaves at least one token, or None.

        A hit marks its entry as recently used.
        """
        query = tuple(ids)
        limit = len(query) - 1
        best: _Entry | None = None
        best_length = 0
        hinted = self._entries.get(self._sessions.get(session_id, ())) if session_id else None
        if hinted is not None and _is_prefix(hinted.tokens, query, limit):
            best, best_length = hinted, len(hinted.tokens)
        else:
            for entry in self._entries.values():
                length = common_prefix_length(entry.tokens, query, limit)
                if length > best_length:
                    best, best_length = entry, length
        if best is None:
            return None
        self._entries.move_to_end(best.tokens)
        return PrefixHit(best_length, best.kv[..., :best_length, :])

    def insert(
        self, tokens: Sequence[int], kv: torch.Tensor, session_id: str | None = None
    ) -> bool:
        """Store ``kv`` (``(layers, 2, H, len(tokens), D)``, not copied) for ``tokens``.

        Returns whether a new entry was stored: not when ``tokens`` is empty, longer than the
        budget, or a prefix of an entry already held (that entry is marked used instead).
        Entries that are prefixes of ``tokens`` are dropped; least-recently-used ones are evicted
        until the new entry fits.
        """
        key = tuple(tokens)
        if kv.shape[-2] != len(key):
            raise ValueError(f"kv holds {kv.shape[-2]} tokens, tokens has {len(key)}")
        if not key or len(key) > self.max_tokens:
            return False
        for existing in list(self._entries):
            shared = common_prefix_length(existing, key)
            if shared == len(key):  # already covered (no entry is a prefix of another)
                self._entries.move_to_end(existing)
                self._point(session_id, existing)
                return False
            if shared == len(existing):
                self._remove(existing)
        while self._tokens + len(key) > self.max_tokens:
            self._remove(next(iter(self._entries)))
        self._entries[key] = _Entry(key, kv)
        self._tokens += len(key)
        self._point(session_id, key)
        return True

    def release(self, session_id: str) -> int:
        """Forget ``session_id``, dropping its latest entry if no other session's latest entry
        is the same one; returns the tokens dropped (``0`` for a session the cache does not
        know)."""
        key = self._sessions.pop(session_id, None)
        if key is None:
            return 0
        entry = self._entries[key]
        entry.sessions.discard(session_id)
        if entry.sessions:
            return 0
        self._remove(key)
        return len(key)

    def clear(self) -> None:
        """Drop every entry (for example because the weights that computed them changed)."""
        self._entries.clear()
        self._sessions.clear()
        self._tokens = 0

    def _point(self, session_id: str | None, key: tuple[int, ...]) -> None:
        """Make ``key`` the session's latest entry (its lookup hint)."""
        if session_id is None:
            return
        previous = self._entries.get(self._sessions.get(session_id, ()))
        if previous is not None:
            previous.sessions.discard(session_id)
        self._entries[key].sessions.add(session_id)
        self._sessions[session_id] = key

    def _remove(self, key: tuple[int, ...]) -> None:
        entry = self._entries.pop(key)
        self._tokens -= len(key)
        for session_id in entry.sessions:
            del self._sessions[session_id]


def _is_prefix(prefix: tuple[int, ...], ids: tuple[int, ...], limit: int) -> bool:
    return len(prefix) <= limit and ids[: len(prefix)] == prefix


def common_prefix_length(a: Sequence[int], b: Sequence[int], limit: int | None = None) -> int:
    """How many leading items ``a`` and ``b`` share, counting at most ``limit``.

    Compares slices of ``_CHUNK`` items at C speed, then single items inside the first slice that
    differs. ``a`` and ``b`` must be of the same sequence type (a tuple never equals a list).
    """
    n = min(len(a), len(b)) if limit is None else max(0, min(len(a), len(b), limit))
    start = 0
    while start < n:
        end = min(start + _CHUNK, n)
        if a[start:end] != b[start:end]:
            return next(i for i in range(start, end) if a[i] != b[i])
        start = end
    return n
