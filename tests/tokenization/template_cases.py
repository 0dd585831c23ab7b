"""Names and sources of the templates every tokenization test runs on (smollm2 vocabulary)."""

from __future__ import annotations

from agentrl.tokenization import BUILTIN_TEMPLATES, builtin_template

FORMATS = ("smollm2", *BUILTIN_TEMPLATES)
IM_END, ENDOFTEXT = 2, 0


def template_source(name: str) -> str | None:
    """The template text for a name in ``FORMATS`` (None: the tokenizer's own)."""
    return None if name == "smollm2" else builtin_template(name)


# Gathers every system message at the top: stable for user and tool messages, but a system message
# added mid-conversation re-renders the beginning.
SYSTEM_ON_TOP = (
    "{% for m in messages if m['role'] == 'system' %}<|im_start|>system\n{{ m['content'] }}"
    "<|im_end|>\n{% endfor %}{% for m in messages if m['role'] != 'system' %}<|im_start|>"
    "{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Gemma-style: roles must alternate user/assistant (after an optional system message); no tool role.
ALTERNATING = (
    "{% for m in messages if m['role'] != 'system' %}"
    "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
