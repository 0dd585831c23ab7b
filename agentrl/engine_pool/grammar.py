"""Constrained decoding: SGLang's ``json_schema``, ``regex``, ``ebnf`` and ``structural_tag``.

A request that sets one of them (:attr:`SamplingParams.constraint`) samples only tokens that keep
its output inside the grammar, as SGLang's default grammar backend does; both use xgrammar
(SGLang 0.5.23 pins 0.2.7, as this project does), built the way SGLang builds it:
``TokenizerInfo.from_huggingface(tokenizer, vocab_size=<the model's>, stop_token_ids=<the model's
end-of-sequence ids>)``, one ``GrammarMatcher`` per request.

Each decode step, :func:`constrain_logits` sets the logits of the tokens a request's grammar
forbids to ``-inf`` before anything else reads them, so the request samples from, and reports the
log-probs of, the constrained distribution (the renormalised one), which is what SGLang reports
(its vocabulary mask is applied to the logits before its sampler computes log-probs). A trainer
that recomputes log-probs from the model alone sees the constraint as mismatch. After the sampled
token is accepted (:func:`accept`), a grammar that has reached its end finishes the request
(``"stop"``, SGLang's ``FINISH_MATCHED_TOKEN``); the grammar's end is a stop token (the engine's
end-of-sequence ids and the request's ``stop_token_ids``) sampled where the grammar may end.

Compiling takes from a millisecond (a regex) to seconds (a large JSON schema); compiled grammars
are cached per constraint (xgrammar's compiler cache). An invalid constraint raises
``ValueError`` with xgrammar's message. A constrained request needs the engine's tokenizer.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    import xgrammar

_BITS = 32  # xgrammar's bitmask packs 32 tokens per int32


class GrammarCompiler:
    """Compiles constraints for one tokenizer and vocabulary (see the module docstring).

    ``stop_token_ids`` are the model's end-of-sequence ids, where a grammar may end."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Collection[int]) -> None:
        import xgrammar as xgr

        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(stop_token_ids)
        )
        self._compiler = xgr.GrammarCompiler(info)

    def compile(self, kind: str, value: str) -> xgrammar.CompiledGrammar:
        """The compiled grammar of one of SGLang's constraint keys; ``ValueError`` if invalid."""
        compiler = self._compiler
        try:
            if kind == "json_schema":
                return compiler.compile_json_schema(value)
            if kind == "regex":
                return compiler.compile_regex(value)
            if kind == "ebnf":
                return compiler.compile_grammar(value)
            if kind == "structural_tag":
                return compiler.compile_structural_tag(value)
        except (RuntimeError, ValueError, TypeError) as exc:  # xgrammar's parse errors
            raise ValueError(f"invalid {kind}: {exc}") from None
        raise ValueError(f"unknown constraint {kind!r}")

    @staticmethod
    def matcher(
        compiled: xgrammar.CompiledGrammar, stop_token_ids: Collection[int] = ()
    ) -> xgrammar.GrammarMatcher:
        """A fresh matcher for one request; ``stop_token_ids`` (the request's own) also end it."""
        import xgrammar as xgr

        stops = sorted({*compiled.tokenizer_info.stop_token_ids, *stop_token_ids})
        return xgr.GrammarMatcher(compiled, override_stop_tokens=stops)


def constrain_logits(
    logits: torch.Tensor, matchers: Sequence[xgrammar.GrammarMatcher | None]
) -> torch.Tensor:
    """``logits`` ``(B, V)`` with each constrained row's forbidden tokens at ``-inf`` (a copy);
    ``logits`` itself when no row is constrained. ``matchers[i]`` is row i's, or None."""
    rows = [i for i, m in enumerate(matchers) if m is not None and not m.is_terminated()]
    if not rows:
        return logits
    import xgrammar as xgr

    vocab = logits.shape[1]
    bitmask = xgr.allocate_token_bitmask(len(rows), vocab)  # (R, ceil(V / 32)) int32, all allowed
    for slot, row in enumerate(rows):
        matcher = matchers[row]
        assert matcher is not None
        matcher.fill_next_token_bitmask(bitmask, slot)
    allowed = allowed_tokens(bitmask.to(logits.device), vocab)  # (R, V) bool
    out = logits.clone()
    index = torch.tensor(rows, device=logits.device)
    out[index] = out[index].masked_fill(~allowed, float("-inf"))
    return out


def allowed_tokens(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """xgrammar's packed bitmask ``(R, W)`` int32 (bit ``j % 32`` of word ``j // 32`` set when
    token ``j`` is allowed) as a ``(R, vocab)`` bool tensor, on the bitmask's device."""
    shifts = torch.arange(_BITS, device=bitmask.device, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1  # (R, W, 32)
    return bits.flatten(1)[:, :vocab].bool()


def accept(matcher: xgrammar.GrammarMatcher, token: int) -> bool:
    """Advance ``matcher`` by the sampled ``token``; True when its grammar has now ended.

    A token the matcher refuses cannot have been sampled from the constrained logits; if it was
    (the grammar had no allowed token left), ``RuntimeError``, which fails that request."""
    if matcher.is_terminated():
        return True
    if not matcher.accept_token(token):
        raise RuntimeError(f"the grammar refused token {token}, which it did not allow")
    return bool(matcher.is_terminated())
