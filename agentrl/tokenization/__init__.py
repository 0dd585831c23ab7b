"""Token-in/token-out trajectories: prompts, engine tokens and chat-template deltas, token-exact.

* :class:`TrajectoryBuilder` accumulates the ids an engine saw: the initial prompt, the engine's
  tokens verbatim (loss mask 1, log-probs, weight version), and env messages as delta tokens from
  the chat template (mask 0). :class:`TokenTrajectory` is the trainer's record.
* :class:`ChatFormat` holds the delta rule and the end-of-turn tokens of a template.
* :func:`check_template` (CLI: ``agentrl check-template``) says whether a template is append-only
  and, where not, which turn re-renders and why; :class:`TemplatePolicy` says what a builder does
  with such a template (``keep`` with a warning, or ``strict``: refuse it).

Guaranteed (and property-tested on SmolLM2's template and the hand-written ones in ``templates/``):
the engine's ids are stored as produced; the ids fed to the engine at every turn are a prefix of the
final ids; loss mask, log-probs and versions are aligned with the engine's ids; for an append-only
template the ids at every generation point decode to the template's rendering of the conversation
so far. They also equal ``encode(render(...))`` except where the tokenizer would merge generated
text with the generation prompt before it (the engine's ids win: that is what it sampled).

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
    check_template,
)
from agentrl.tokenization.trajectory import (
    Segment,
    SegmentKind,
    TemplateNotAppendOnlyError,
    TemplatePolicy,
    TemplateWarning,
    TokenTrajectory,
    TrajectoryBuilder,
)

__all__ = [
    "BUILTIN_TEMPLATES",
    "ChatFormat",
    "IssueKind",
    "Segment",
    "SegmentKind",
    "TemplateError",
    "TemplateIssue",
    "TemplateNotAppendOnlyError",
    "TemplatePolicy",
    "TemplateReport",
    "TemplateWarning",
    "TokenTrajectory",
    "TrajectoryBuilder",
    "builtin_template",
    "check_template",
]
