"""Choosing the engine's dtype from what the CPU supports; the GGUF converted once per machine."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.models import (
    CONVERTED_MARKER,
    cpu_has_native_bfloat16,
    engine_dtype,
    resolve_model,
    smollm2_gguf,
)

INTEL = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_bf16 amx_tile\n"
AMD = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n"


def test_native_bfloat16_is_read_from_the_cpu_flags():
    assert cpu_has_native_bfloat16(INTEL) and not cpu_has_native_bfloat16(AMD)
    assert not cpu_has_native_bfloat16("no flags here")


def test_auto_follows_this_machine():
    flags = Path("/proc/cpuinfo").read_text()
    native = "avx512_bf16" in flags or "amx_bf16" in flags
    assert engine_dtype("auto") == ("bfloat16" if native else "float32")
    assert engine_dtype("float32") == "float32" and engine_dtype("bfloat16") == "bfloat16"


CONVERT = """
import sys
from pathlib import Path
from agentrl.models import converted_gguf, smollm2_gguf
print(converted_gguf(smollm2_gguf(), cache_dir=Path(sys.argv[1])))
"""


@pytest.mark.slow
def test_the_converted_gguf_is_the_gguf(tmp_path, monkeypatch):
    """Two processes convert at once into an empty cache: one converts, both get its directory,
    and what loads from it is what transformers loads from the GGUF: every weight bit for bit,
    the config, the generation config and the tokenizer (ids, decoding, chat template)."""
    import torch
    from transformers import AutoTokenizer

    from agentrl.models import ModelSource, _gguf_source, load_model, load_tokenizer

    runs = [
        subprocess.Popen(
            [sys.executable, "-c", CONVERT, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [run.communicate(timeout=300) for run in runs]
    assert all(run.returncode == 0 for run in runs), [err[-2000:] for _, err in outputs]
    directories = {out.strip() for out, _ in outputs}
    assert len(directories) == 1
    assert sum("converting" in err for _, err in outputs) == 1  # the other waited on the lock
    converted = Path(directories.pop())
    assert json.loads((converted / CONVERTED_MARKER).read_text())["gguf"] == str(smollm2_gguf())
    assert sorted(p.name for p in tmp_path.joinpath("models").iterdir()) == [
        f".{converted.name}.lock",
        converted.name,
    ]  # no staging directory left

    monkeypatch.setenv("AGENTRL_GGUF_CACHE", "0")  # the reference: transformers on the GGUF
    gguf = smollm2_gguf()
    _gguf_source.cache_clear()
    try:
        assert resolve_model(gguf) == ModelSource(gguf.parent, gguf.name)
        reference = load_model(gguf)
        want = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    finally:
        _gguf_source.cache_clear()
    ours, got = load_model(converted), load_tokenizer(converted)
    assert _config(ours.config) == _config(reference.config)
    assert ours.generation_config.to_dict() == reference.generation_config.to_dict()
    theirs = reference.state_dict()
    assert ours.state_dict().keys() == theirs.keys()
    for name, tensor in ours.state_dict().items():
        assert tensor.dtype == torch.float32 and torch.equal(tensor, theirs[name]), name

    texts = ["Hello, world!", "  spaces\tand\nnewlines  ", "x = 6 * 7 # ünïcödé 数学 🙂", ""]
    for text in texts:
        assert got(text).input_ids == want(text).input_ids
    ids = want("<python>print(1)</python>\n\\boxed{42}").input_ids
    assert got.decode(ids) == want.decode(ids)
    assert got.all_special_tokens == want.all_special_tokens
    assert (got.eos_token_id, got.pad_token_id, got.bos_token_id) == (
        want.eos_token_id,
        want.pad_token_id,
        want.bos_token_id,
    )
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 6 * 7?"},
        {"role": "assistant", "content": "42"},
    ]
    assert got.apply_chat_template(messages, tokenize=False) == want.apply_chat_template(
        messages, tokenize=False
    )
    assert got.apply_chat_template(messages[:2], add_generation_prompt=True) == (
        want.apply_chat_template(messages[:2], add_generation_prompt=True)
    )


def _config(config) -> dict:
    """What defines the model: everything but where it was loaded from, by which version, and
    ``architectures``, which a GGUF load leaves unset and a saved directory names (the class)."""
    ignored = {"_name_or_path", "transformers_version", "architectures"}
    return {k: v for k, v in config.to_dict().items() if k not in ignored}
