"""``agentrl extend-context MODEL OUT --factor F``: a copy of a model whose rotary position
embedding is scaled to ``F`` times its trained context, for episodes longer than it was trained on.

A model refuses positions past its ``max_position_embeddings`` (SmolLM2-135M: 8,192) in the
embedded engine, and its rotary embedding was never trained beyond them. The copy is the same
weights with a config that scales the rotary embedding (transformers' ``rope_parameters``:
``yarn`` by default, as Qwen's long-context models ship, or ``linear`` position interpolation),
and ``max_position_embeddings`` raised by the factor. The trainer, the embedded
engine, ``agentrl serve`` and ``agentrl eval`` load it as any model directory, so rollouts and
training use the same positions (transformers computes both). What it costs: every position's
rotation changes, short contexts included, so the model sees even its trained positions somewhat
differently until it is trained on the new ones (YaRN keeps the high frequencies, which carry
nearby positions, as they were, and changes the short contexts less than linear interpolation).
Transformers' ``dynamic`` NTK scaling is not offered: it takes ``max_position_embeddings`` as the
trained length, which the engine also reads as the longest input it accepts.

    agentrl extend-context smollm2 runs/smollm2-32k --factor 4
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Literal

from agentrl.models import load_model, load_tokenizer, save_hf, tied_aliases

Method = Literal["yarn", "linear"]
METHODS: tuple[Method, ...] = ("yarn", "linear")


def extend_context(
    model: str | Path, out: str | Path, factor: float, method: Method = "yarn"
) -> Path:
    """Write ``model`` (a reference as :func:`agentrl.models.resolve_model` takes it) to ``out`` as
    a Hugging Face directory whose rotary embedding is scaled by ``factor`` with ``method``; its
    ``max_position_embeddings`` is the original times ``factor``. Raises ``ValueError`` for a
    factor not above 1, an unknown method, a model already scaled, or an ``out`` that exists."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if not factor > 1:
        raise ValueError(f"factor must be above 1, got {factor}")
    out = Path(out)
    if out.exists():
        raise ValueError(f"{out} exists; give a new directory")
    loaded = load_model(model)
    config = loaded.config
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if rope.get("rope_type", "default") != "default" or "rope_theta" not in rope:
        raise ValueError(
            f"{model}'s rotary embedding is {rope or 'not a plain rope_parameters dict'}; only "
            "an unscaled rotary embedding can be extended here"
        )
    original = int(config.max_position_embeddings)
    rope.update(rope_type=method, factor=float(factor))
    if method == "yarn":
        rope["original_max_position_embeddings"] = original
    config.rope_parameters = rope
    config.max_position_embeddings = int(original * factor)
    aliases = tied_aliases(loaded)
    weights = {name: t for name, t in loaded.state_dict().items() if name not in aliases}
    save_hf(loaded, weights, out, tokenizer=load_tokenizer(model))
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="smollm2, a model directory or a .gguf file")
    parser.add_argument("out", type=Path, help="the new model directory (must not exist)")
    parser.add_argument(
        "--factor", type=float, required=True, help="new context / trained context (above 1)"
    )
    parser.add_argument("--method", choices=METHODS, default="yarn", help="rotary scaling")


def run(args: argparse.Namespace) -> int:
    try:
        out = extend_context(args.model, args.out, args.factor, args.method)
    except (ValueError, FileNotFoundError) as exc:
        print(f"agentrl extend-context: {exc}")
        return 2
    config = json.loads((out / "config.json").read_text())
    print(
        f"wrote {out}: max_position_embeddings {config['max_position_embeddings']}, "
        f"rope_parameters {config['rope_parameters']}"
    )
    return 0
