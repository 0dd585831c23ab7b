"""Choosing the engine's dtype from what the CPU supports."""

from pathlib import Path

from agentrl.models import cpu_has_native_bfloat16, engine_dtype

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
