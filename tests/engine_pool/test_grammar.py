"""Constrained decoding in the embedded engine (SGLang's ``json_schema``, ``regex``, ``ebnf``,
``structural_tag``) with SmolLM2: every output is a sentence of its grammar, a constrained row
leaves the rows beside it alone, log-probs are the constrained distribution's, and a bad
constraint is refused to its caller only. Judged by SGLang 0.5.23's own code (the harness in
``sglang_conformance/sglang_side.py``): at every step of the engine's constrained outputs, SGLang's
grammar backend allows the same tokens and ends where the engine ended; the tool calls
``tool_choice`` forces are read by SGLang's own ``qwen25`` tool-call parser as ours reads them."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
import torch
from test_sglang_conformance import side, side_python  # noqa: F401

from agentrl.engine_pool import LocalEngine, SamplingParams
from agentrl.engine_pool.grammar import GrammarCompiler, accept, allowed_tokens
from agentrl.models import resolve_model
from agentrl.tools import HermesParser

QUESTION = [{"role": "user", "content": "Is the sky blue? Answer in one word."}]
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "enum": ["yes", "no"]},
        "sure": {"type": "boolean"},
    },
    "required": ["answer", "sure"],
    "additionalProperties": False,
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
        "strict": True,
    },
}


def prompt(tokenizer, messages=QUESTION, tools=None) -> list[int]:
    return list(
        tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, return_dict=False
        )
    )


def text(tokenizer, result) -> str:
    return tokenizer.decode(result.token_ids, skip_special_tokens=True)


async def test_each_constraint_kind_holds_greedy_and_sampled(engine, tokenizer):
    ids = prompt(tokenizer)
    cases = [
        (SamplingParams(regex=r"(Yes|No)\.", max_new_tokens=12), r"(Yes|No)\."),
        (
            SamplingParams(ebnf='root ::= ("yes" | "no") " " [0-9]', max_new_tokens=12),
            r"(yes|no) \d",
        ),
    ]
    results = await asyncio.gather(
        *(engine.generate(ids, params, None) for params, _ in cases),
        *(
            engine.generate(ids, SamplingParams(json_schema=json.dumps(SCHEMA), temperature=t,
                                                seed=s, max_new_tokens=48))
            for t, s in [(0, None), (1.0, 1), (1.0, 2)]
        ),
    )  # fmt: skip
    for (_, pattern), result in zip(cases, results, strict=False):
        assert result.finish_reason == "stop" and re.fullmatch(pattern, text(tokenizer, result))
        assert result.token_ids[-1] in engine.eos_token_ids  # the grammar ends on a stop token
    for result in results[len(cases) :]:
        assert result.finish_reason == "stop", text(tokenizer, result)
        answer = json.loads(text(tokenizer, result))
        assert set(answer) == {"answer", "sure"} and answer["answer"] in ("yes", "no")
        assert isinstance(answer["sure"], bool)


async def test_a_tool_call_structural_tag_yields_a_call_the_parser_reads(engine, tokenizer):
    """HermesParser's tag for a named function: one ``add`` call, arguments under its schema."""
    parser = HermesParser()
    messages = [{"role": "user", "content": "Tell me a joke."}]  # nothing asks for a tool
    ids = prompt(tokenizer, messages, tools=[ADD])
    tag = parser.structural_tag([ADD], "add")
    free, forced = await asyncio.gather(
        engine.generate(ids, SamplingParams(temperature=0, max_new_tokens=60)),
        engine.generate(ids, SamplingParams(temperature=0, max_new_tokens=60, structural_tag=tag)),
    )
    assert not parser.parse(text(tokenizer, free)).calls  # unconstrained, it tells a joke
    parsed = parser.parse(text(tokenizer, forced))
    assert forced.finish_reason == "stop" and not parsed.errors and parsed.text.strip() == ""
    (call,) = parsed.calls
    assert call.name == "add" and set(call.arguments) == {"a", "b"}
    assert all(isinstance(v, int) for v in call.arguments.values())


async def test_a_constrained_row_leaves_the_others_alone(engine, tokenizer):
    ids = prompt(tokenizer)
    plain = SamplingParams(temperature=0, max_new_tokens=16)
    alone = await engine.generate(ids, plain)
    beside, constrained = await asyncio.gather(
        engine.generate(ids, plain),
        engine.generate(ids, SamplingParams(temperature=0, max_new_tokens=16, regex="[0-9]+")),
    )
    assert beside.token_ids == alone.token_ids
    assert re.fullmatch("[0-9]+", text(tokenizer, constrained))


async def test_logprobs_are_the_constrained_distributions(engine, tokenizer):
    """Once the word is written, the grammar allows only the end of the sequence, which so is
    certain: log-prob 0, as SGLang reports it (the mask is applied to the logits before log-probs
    are taken). Unconstrained, the same token after the same text is not certain."""
    ids = prompt(tokenizer)
    word = "Certainly"
    forced = await engine.generate(ids, SamplingParams(temperature=1.0, seed=0, regex=word))
    assert text(tokenizer, forced) == word and forced.token_ids[-1] in engine.eos_token_ids
    assert forced.logprobs[-1] == 0.0 and all(lp <= 0 for lp in forced.logprobs)
    free = await engine.generate(
        ids + forced.token_ids[:-1], SamplingParams(temperature=0, max_new_tokens=1)
    )
    assert free.logprobs[0] < 0  # the model alone is certain of no token there


async def test_bad_constraints_are_refused_to_their_caller_only(engine, tokenizer):
    ids = prompt(tokenizer)
    for params in (
        SamplingParams(regex="(unclosed"),
        SamplingParams(json_schema="{not json"),
        SamplingParams(ebnf="root ::= undefined_rule"),
        SamplingParams(structural_tag='{"type": "structural_tag", "format": {"type": "nope"}}'),
    ):
        with pytest.raises(ValueError, match=f"invalid {params.constraint[0]}"):
            await engine.generate(ids, params)
    with pytest.raises(ValueError, match="at most one of"):
        SamplingParams(regex="a", ebnf='root ::= "a"')
    with pytest.raises(ValueError, match="non-empty string"):
        SamplingParams(json_schema="")
    result = await engine.generate(ids, SamplingParams(temperature=0, max_new_tokens=2))
    assert len(result.token_ids) == 2  # the engine still serves


async def test_constrained_decoding_needs_the_engines_tokenizer(smollm2):
    async with LocalEngine(smollm2) as engine:  # a model object and no tokenizer
        with pytest.raises(ValueError, match="constrained decoding need the engine's tokenizer"):
            await engine.generate([1, 2, 3], SamplingParams(regex="a"))


def test_the_packed_bitmask_unpacks_token_by_token():
    vocab = 70
    allowed = torch.zeros(2, vocab, dtype=torch.bool)
    allowed[0, [0, 31, 32, 69]] = True
    allowed[1] = True
    words = torch.zeros(2, 3, dtype=torch.int64)
    for row, token in allowed.nonzero().tolist():
        words[row, token // 32] |= 1 << (token % 32)
    packed = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # int32 wraps
    assert torch.equal(allowed_tokens(packed, vocab), allowed)


@pytest.mark.slow
async def test_sglangs_grammar_backend_allows_what_the_engine_allowed(
    engine,
    tokenizer,
    side_python,  # noqa: F811
):
    """Each constraint kind, SmolLM2's own outputs under it: per step, the vocabulary mask
    SGLang's ``XGrammarGrammarBackend`` fills equals the engine's (same bytes), the sampled id is
    allowed by both, and both grammars end on the same token; an invalid constraint is invalid to
    both."""
    ids = prompt(tokenizer, [{"role": "user", "content": "Add 2 and 3."}], tools=[ADD])
    constraints = [
        ("regex", r"(Yes|No)\. [a-z ]{0,12}"),
        ("ebnf", 'root ::= ("yes" | "no") " " [0-9]+'),
        ("json_schema", json.dumps(SCHEMA)),
        ("structural_tag", HermesParser().structural_tag([ADD])),
    ]
    results = await asyncio.gather(
        *(
            engine.generate(ids, SamplingParams(temperature=t, seed=1, max_new_tokens=48,
                                                **{kind: value}))
            for kind, value in constraints
            for t in (0, 1.0)
        )
    )  # fmt: skip
    cases = [
        {"kind": kind, "value": value, "output_ids": result.token_ids}
        for (kind, value), result in zip(
            [c for c in constraints for _ in (0, 1)], results, strict=True
        )
    ]
    stopped = [result.finish_reason == "stop" for result in results]
    assert sum(stopped) >= len(constraints)  # most end inside their token budget
    cases.append({"kind": "regex", "value": "(unclosed", "output_ids": []})
    vocab = engine.model.get_input_embeddings().num_embeddings
    spec = {
        "tokenizer": str(resolve_model("smollm2").directory),
        "vocab_size": vocab,
        "eos_token_ids": sorted(engine.eos_token_ids),
        "cases": cases,
    }
    judged = await asyncio.to_thread(side, side_python, "grammar", spec)
    ours = GrammarCompiler(tokenizer, vocab, engine.eos_token_ids)
    with pytest.raises(ValueError):
        ours.compile("regex", "(unclosed")
    assert judged[-1] == {"invalid": True}
    import hashlib

    import xgrammar as xgr

    for case, verdict, stop in zip(cases[:-1], judged[:-1], stopped, strict=True):
        matcher = ours.matcher(ours.compile(case["kind"], case["value"]))
        steps = []
        for token in case["output_ids"]:
            mask = xgr.allocate_token_bitmask(1, vocab)
            matcher.fill_next_token_bitmask(mask, 0)
            allowed = bool(allowed_tokens(mask, vocab)[0, token])
            digest = hashlib.sha256(mask.numpy().tobytes()).hexdigest()
            steps.append({"mask": digest, "allowed": allowed, "ended": accept(matcher, token)})
        assert verdict == {"invalid": False, "steps": steps}, case
        # every sampled id was allowed; the grammar ended exactly when the engine stopped
        assert all(step["allowed"] for step in steps) and steps[-1]["ended"] == stop


@pytest.mark.slow
async def test_sglangs_tool_call_parser_reads_the_forced_calls_as_ours(
    engine,
    tokenizer,
    side_python,  # noqa: F811
):
    parser = HermesParser()
    messages = [{"role": "user", "content": "Tell me a joke."}]
    ids = prompt(tokenizer, messages, tools=[ADD])
    tags = [parser.structural_tag([ADD], name) for name in (None, "add")]
    results = await asyncio.gather(
        *(
            engine.generate(ids, SamplingParams(temperature=1.0, seed=seed, max_new_tokens=80,
                                                structural_tag=tag))
            for tag in tags
            for seed in (1, 2)
        )
    )  # fmt: skip
    texts = [text(tokenizer, result) for result in results]
    spec = {"parser": "qwen25", "tools": [ADD], "texts": texts}
    judged = await asyncio.to_thread(side, side_python, "tool-calls", spec)
    ours = [
        [{"name": c.name, "arguments": c.arguments} for c in parser.parse(t).calls] for t in texts
    ]
    assert judged == ours and all(calls for calls in ours), texts
