"""Stop strings: whether the token a request just sampled completed one of its stop strings.

The rule is SGLang's, exactly (``Req._check_str_based_finish`` and ``SamplingParams.normalize`` in
SGLang 0.5.23): after each token, decode the last ``n + 1`` generated tokens with the tokenizer's
plain ``decode`` (special tokens kept), where ``n`` is the longest tokenization of a stop string
on its own (``encode(s, add_special_tokens=False)``), and end the request on the first string of
``SamplingParams.stop``, in the order given, that the decoded tail contains. The ids stay exactly
as sampled, the completing token included.

What the rule does not see, in SGLang as here: a stop string the model spells in more than
``n + 1`` tokens (for example one character at a time) ends nothing. SGLang's fallback, ``stop_str
in Req.decoded_text``, never fires in its scheduler, where ``decoded_text`` stays empty. The same
ids give the same decision on both engines, which is what makes a trajectory sampled by one
reproducible on the other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Decode = Callable[[list[int]], str]
Encode = Callable[[str], list[int]]


def stop_tail_tokens(stop: Sequence[str], encode: Encode) -> int:
    """How many trailing tokens are decoded to look for ``stop`` (0 when there is none)."""
    return max((len(encode(s)) for s in stop), default=-1) + 1


def completed_stop(
    token_ids: list[int], stop: Sequence[str], tail_tokens: int, decode: Decode
) -> str | None:
    """The first string of ``stop`` found in the decoded last ``tail_tokens`` of ``token_ids``,
    else None. Called after every token, so a match found here was completed by the last one."""
    if not stop or not token_ids:
        return None
    tail = decode(token_ids[-tail_tokens:])
    return next((s for s in stop if s in tail), None)
