"""Token-in/token-out trajectories: prompts, engine tokens and chat-template deltas, token-exact.

* :class:`TrajectoryBuilder` accumulates the ids an engine saw: the initial prompt, the engine's
  tokens verbatim (loss mask 1, log-probs, weight version), and env messages as delta tokens from
  the chat template (mask 0). :class:`TokenTrajectory` is the trainer's record.
* :class:`ChatFormat` holds the delta rule and the end-of-turn tokens of a template.
* :func:`check_template` (CLI: ``agentrl check-template``) gives a :class:`Verdict` per use (with
  tools, without, an empty environment reply) by building the sample conversations with the
  builder's mechanics (:mod:`.token_trajectory`, without the template check) and comparing their
  ids with a full encode at every generation point: append-only, token seams (same text, other
  ids), not append-only (other text, and why), or cannot be used. :class:`TemplatePolicy` says
  what a builder does with a template that is not append-only (``keep`` with a warning, or
  ``strict``: refuse it); :class:`SeamPolicy` what it does at token seams.
* Templates that print the date or time see the episode's start (:mod:`.clock`).

Guaranteed (and property-tested on SmolLM2's template, the hand-written ones in ``templates/`` and
the published templates of real model families in ``tests/tokenization/real_templates``): the
engine's ids are stored as produced; the ids fed to the engine at every turn are a prefix of the
final ids (unless ``seams="reencode"``); loss mask, log-probs and versions are aligned with the
engine's ids; where the checker says append-only, the ids at every generation point equal
``encode(render(...))`` of the conversation so far whenever the engine's ids are the tokenizer's own
encoding of its text; where it says token seams, they decode to the same text, and equal the
encode with ``seams="reencode"``.

Not guaranteed: text the tokenizer cannot represent (the smollm2 vocabulary has no byte token for
0x04, 0x06, 0x13, 0x14, 0x16, 0x1d or U+40000..U+BFFFF and drops them); special-token text inside
environment messages is encoded as the special token, as ``apply_chat_template`` does by default;
templates that ignore ``tools`` (SmolLM2's) do not show the schemas to the model (the checker says so).
"""

from agentrl.tokenization.chat_format import (
    BUILTIN_TEMPLATES,
    ChatFormat,
    TemplateError,
    builtin_template,
)
from agentrl.tokenization.checker import (
    IssueKind,
    TemplateIssue,
    TemplateReport,
    TokenSeam,
    UseReport,
    Verdict,
    check_template,
)
from agentrl.tokenization.token_trajectory import (
    SeamEdit,
    SeamPolicy,
    Segment,
    SegmentKind,
    TokenTrajectory,
)
from agentrl.tokenization.trajectory import (
    TemplateNotAppendOnlyError,
    TemplatePolicy,
    TemplateWarning,
    TrajectoryBuilder,
)

__all__ = [
    "BUILTIN_TEMPLATES",
    "ChatFormat",
    "IssueKind",
    "SeamEdit",
    "SeamPolicy",
    "Segment",
    "SegmentKind",
    "TemplateError",
    "TemplateIssue",
    "TemplateNotAppendOnlyError",
    "TemplatePolicy",
    "TemplateReport",
    "TemplateWarning",
    "TokenSeam",
    "TokenTrajectory",
    "TrajectoryBuilder",
    "UseReport",
    "Verdict",
    "builtin_template",
    "check_template",
]
