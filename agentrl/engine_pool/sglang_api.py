"""The subset of SGLang's native HTTP API that agentrl speaks, in one place: client and server share it.

Shapes are taken from SGLang's source (release 0.5.23; repository ``sgl-project/sglang``):
``python/sglang/srt/entrypoints/http_server.py`` (routes, error bodies) and
``python/sglang/srt/managers/io_struct.py`` (``GenerateReqInput``, ``AbortReq``,
``PauseGenerationReqInput``, ``UpdateWeightFromDiskReqInput``, ``UpdateWeightsFromTensorReqInput``,
``InitWeightsUpdateGroupReqInput``, ``UpdateWeightsFromDistributedReqInput``);
``tokenizer_manager.py`` builds ``meta_info``. ``docs/sglang_http_api.md`` has the field-by-field notes.

``POST /generate`` request (one prompt; batches are not used)::

    {"input_ids": [int], "rid": str, "return_logprob": true, "stream": false,
     "sampling_params": {"temperature", "top_p", "top_k", "max_new_tokens", "stop_token_ids",
                         "stop", "no_stop_trim", "ignore_eos", "sampling_seed",
                         and the penalties and "min_new_tokens" when set}}

Response: ``{"text"?, "output_ids": [int], "meta_info": {"id", "finish_reason",
"prompt_tokens", "completion_tokens", "cached_tokens", "weight_version", "weight_versions"?,
"output_token_logprobs": [[logprob, token_id, text|null]]}}``. ``finish_reason`` is
``{"type": "stop", "matched": id | str}`` (a stop token, or the stop string found), ``{"type":
"length", "length": n}`` or ``{"type": "abort", "message": str}``. ``output_ids`` include the stop
token, and every token up to the one that completed a stop string (``no_stop_trim`` only keeps
the match in ``text``; SGLang never trims the ids for a stop string). Weight versions are strings in SGLang;
agentrl's are ints written as decimal strings (SGLang's initial ``"default"`` reads as 0).

What an SGLang server does that its client must handle (SGLang 0.5.23's source, cited in
``docs/sglang_http_api.md``): an aborted request that never ran answers with no tokens and one
weight-version span ``start == end == 0``; ``top_k`` 0 is spelled ``-1``; a queued request's abort
has no ``prompt_tokens``. The rest (exact-rid aborts, weight-update sessions, the cache flush, seeds,
``ignore_eos`` and the context limit) is handled by
:class:`~agentrl.engine_pool.sglang_engine.SGLangEngine`, which knows the server it talks to.
"""

from __future__ import annotations

import base64
import binascii
import io
import time
from datetime import UTC, datetime
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch

from agentrl.engine_pool.engine import (
    CONSTRAINT_KEYS,
    FinishReason,
    GenerateResult,
    SamplingParams,
)
from agentrl.engine_pool.sglang_sampling import (
    PENALTY_KEYS,
    ContractError,
    ProtocolError,
    check_sampling_keys,
)
from agentrl.engine_pool.tensor_refs import CUDA_DEVICE_ARG, is_by_reference, read_sglang_payload

__all__ = ["ContractError", "ProtocolError"]  # besides the functions below

ABORT_MESSAGE = "Aborted"


# -- requests ---------------------------------------------------------------------------------


def generate_request(
    input_ids: list[int], sampling: SamplingParams, rid: str, *, stream: bool = False
) -> dict[str, Any]:
    """The ``/generate`` body for one prompt of token ids, asking for output log-probs."""
    params: dict[str, Any] = {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k if sampling.top_k > 0 else -1,
        "max_new_tokens": sampling.max_new_tokens,
        "ignore_eos": sampling.ignore_eos,
    }
    if sampling.stop_token_ids:
        params["stop_token_ids"] = list(sampling.stop_token_ids)
    if sampling.stop:
        params["stop"] = list(sampling.stop)
        params["no_stop_trim"] = True  # the text keeps the match, as the ids do
    if sampling.seed is not None:
        params["sampling_seed"] = sampling.seed
    if sampling.min_p:
        params["min_p"] = sampling.min_p
    for key in PENALTY_KEYS:  # sent only when set, as a client of an older server would
        value = getattr(sampling, key)
        if value != SamplingParams.__dataclass_fields__[key].default:
            params[key] = value
    if sampling.constraint is not None:
        key, value = sampling.constraint
        params[key] = value
    return {
        "input_ids": list(input_ids),
        "sampling_params": params,
        "rid": rid,
        "return_logprob": True,
        "stream": stream,
    }


def parse_generate_request(body: Any) -> tuple[list[int], SamplingParams, str | None, bool]:
    """``(input_ids, sampling, rid, stream)`` from a ``/generate`` body, or :class:`ProtocolError`.

    Only token-id prompts are served (``text`` and batches are refused with a clear message);
    ``sampling_params`` keys are checked by
    :func:`~agentrl.engine_pool.sglang_sampling.check_sampling_keys`: a key SGLang does not know is a
    :class:`ContractError`, a value agentrl cannot honour a :class:`ProtocolError` naming the key.
    """
    if not isinstance(body, dict):
        raise ProtocolError(f"the body must be a JSON object, got {type(body).__name__}")
    if body.get("text") is not None or body.get("input_embeds") is not None:
        raise ProtocolError("this server takes token ids only: send `input_ids`, not `text`")
    input_ids = body.get("input_ids")
    if not isinstance(input_ids, list) or not input_ids:
        raise ProtocolError("`input_ids` must be a non-empty list of token ids")
    if any(isinstance(item, list) for item in input_ids):
        raise ProtocolError("batched `input_ids` (a list of lists) are not supported; send one")
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in input_ids):
        raise ProtocolError("`input_ids` must contain only integers")
    raw = body.get("sampling_params") or {}
    if not isinstance(raw, dict):
        raise ProtocolError("`sampling_params` must be an object")
    check_sampling_keys(raw)  # SGLang's key list; what agentrl serve cannot honour is refused
    known = {
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "max_new_tokens",
        "stop_token_ids",
        "stop",
        "ignore_eos",
        *PENALTY_KEYS,
    }
    values = {key: raw[key] for key in known if raw.get(key) is not None}
    # constrained decoding: an empty string is unset, as SGLang's SamplingParams reads it
    values |= {key: raw[key] for key in CONSTRAINT_KEYS if raw.get(key) not in (None, "")}
    if values.get("top_k") == -1:
        values["top_k"] = 0
    if "stop_token_ids" in values:
        values["stop_token_ids"] = tuple(values["stop_token_ids"])
    if isinstance(values.get("stop"), str):
        values["stop"] = (values["stop"],)
    if isinstance(values.get("stop"), list):
        values["stop"] = tuple(values["stop"])
    values.setdefault("max_new_tokens", 128)  # SGLang's default
    try:
        sampling = SamplingParams(**values, seed=raw.get("sampling_seed"))
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"bad sampling_params: {exc}") from None
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise ProtocolError("`rid` must be a string")
    return input_ids, sampling, rid, bool(body.get("stream", False))


# -- responses --------------------------------------------------------------------------------


def generate_response(
    result: GenerateResult, rid: str, *, cached_tokens: int = 0
) -> dict[str, Any]:
    """The ``/generate`` response body for ``result`` (what ``agentrl serve`` sends)."""
    if result.finish_reason == "stop":
        matched = result.matched_stop if result.matched_stop is not None else result.token_ids[-1]
        finish: dict[str, Any] = {"type": "stop", "matched": matched}
    elif result.finish_reason == "length":
        finish = {"type": "length", "length": len(result.token_ids)}
    else:
        finish = {"type": "abort", "message": ABORT_MESSAGE, "status_code": None, "err_type": None}
    return {
        "output_ids": result.token_ids,
        "meta_info": {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": len(result.token_ids),
            "cached_tokens": cached_tokens,
            "weight_version": str(result.weight_version),
            "weight_versions": _version_spans(result.token_weight_versions, result.weight_version),
            "output_token_logprobs": [
                [logprob, token, None]
                for logprob, token in zip(result.logprobs, result.token_ids, strict=True)
            ],
        },
    }


def parse_generate_response(body: Any, prompt_tokens: int) -> GenerateResult:
    """A :class:`GenerateResult` from a ``/generate`` response, or :class:`ProtocolError`.

    Accepts SGLang's older and newer shapes: ``text`` may be absent, a queued request's abort has
    no ``prompt_tokens``, ``weight_versions`` spans may be absent (every token then carries
    ``weight_version``).
    """
    try:
        meta = body["meta_info"]
        token_ids = [int(token) for token in body["output_ids"]]
        pairs = meta.get("output_token_logprobs")
        if pairs is None:
            if token_ids:
                raise ProtocolError("the response has no `output_token_logprobs`")
            pairs = []
        logprobs = [float(pair[0]) for pair in pairs]
        logprob_ids = [int(pair[1]) for pair in pairs]
        reason = _finish_reason(meta["finish_reason"])
        finish = meta["finish_reason"]
        matched = finish.get("matched") if isinstance(finish, dict) else None
        version = parse_version(meta.get("weight_version", "default"))
        spans = meta.get("weight_versions")
        versions = _versions_from_spans(spans, len(token_ids)) if spans else []
    except ProtocolError:
        raise
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ProtocolError(f"malformed /generate response ({type(exc).__name__}: {exc})") from None
    if logprob_ids != token_ids:
        raise ProtocolError(
            f"the response's log-probs are for tokens {logprob_ids[:8]}..., "
            f"not for its output_ids {token_ids[:8]}..."
        )
    return GenerateResult(
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason=reason,
        weight_version=versions[-1] if versions else version,
        token_weight_versions=versions or [version] * len(token_ids),
        prompt_tokens=int(meta.get("prompt_tokens", prompt_tokens)),
        request_id=str(meta.get("id", "")),
        matched_stop=matched if reason == "stop" and isinstance(matched, str) else None,
    )


def loads_body(
    *,
    running: int,
    max_running: int,
    cache_hit_rate: float,
    include: str | None = None,
    dp_rank: str | None = None,
) -> dict[str, Any]:
    """``GET /v1/loads`` as SGLang 0.5.23 answers it (``entrypoints/v1_loads.py``,
    ``LoadSnapshot.to_dict``): one rank's snapshot, its core fields; those agentrl has no
    counterpart for are SGLang's defaults (0). ``include`` is checked as SGLang checks it
    (:class:`ProtocolError` naming the bad sections); ``dp_rank`` other than 0 answers no loads."""
    valid = {"core", "memory", "spec", "lora", "disagg", "queues", "all"}
    sections = {part.strip() for part in include.split(",")} if include else set()
    if not sections <= valid:
        raise ProtocolError(
            f"Invalid include sections: {sections - valid}. Valid options: {sorted(valid)}"
        )
    load = {
        "timestamp": time.time(),
        "dp_rank": 0,
        "num_running_reqs": running,
        **dict.fromkeys(_ZERO_LOAD_FIELDS, 0),
        "max_running_requests": max_running,
        "token_usage": 0.0,
        "gen_throughput": 0.0,
        "cache_hit_rate": cache_hit_rate,
        "utilization": running / max(1, max_running),
        "decode_moments": None,
    }
    return {
        "timestamp": datetime.now(UTC).isoformat(),
        "version": "agentrl",
        "accelerator": None,
        "num_accelerators": 1,
        "loads": [load] if dp_rank in (None, "0") else [],
    }


_ZERO_LOAD_FIELDS = (
    "num_waiting_reqs",
    "num_waiting_uncached_tokens",
    "num_used_tokens",
    "num_total_tokens",
    "num_active_tokens",
    "num_prealloc_ready_tokens",
    "max_total_num_tokens",
    "total_prefill_uncached_tokens",
    "total_prefill_busy_us",
)


# -- weight payloads (``serialized_named_tensors`` entries) ------------------------------------


def encode_named_tensors(named_tensors: list[tuple[str, torch.Tensor]]) -> str:
    """agentrl's ``serialized_named_tensors`` entry: base64 of ``torch.save`` of the list."""
    buffer = io.BytesIO()
    torch.save([(name, tensor.detach().cpu()) for name, tensor in named_tensors], buffer)
    return base64.b64encode(buffer.getvalue()).decode()


def decode_named_tensors(
    payload: str, load_format: str | None = None
) -> list[tuple[str, torch.Tensor]]:
    """The named tensors of one ``serialized_named_tensors`` entry, in either format: the inverse
    of :func:`encode_named_tensors` (``weights_only``: no arbitrary objects), or an SGLang sender's
    by-reference dump (:func:`~agentrl.engine_pool.tensor_refs.read_sglang_payload`, which says
    what it reads and refuses; ``load_format`` applies to it)."""
    try:
        raw = base64.b64decode(payload, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"a serialized_named_tensors entry is not base64: {exc}") from exc
    if is_by_reference(raw):
        return read_sglang_payload(raw, load_format)
    if load_format not in (None, "direct"):
        raise ValueError(f"load_format {load_format!r} needs an SGLang by-reference payload")
    data = torch.load(io.BytesIO(raw), weights_only=True)
    if not isinstance(data, list) or not all(
        isinstance(item, (list, tuple)) and len(item) == 2 for item in data
    ):
        raise ValueError("serialized_named_tensors must decode to a list of (name, tensor) pairs")
    return [(str(name), tensor) for name, tensor in data]


def sglang_tensor_payloads(
    named_tensors: list[tuple[str, torch.Tensor]], tp_size: int = 1
) -> list[str]:
    """SGLang's ``serialized_named_tensors``: one entry per TP rank, each its own dump.

    Each entry is base64 of a ``ForkingPickler`` dump of ``named_tensors``, what SGLang's
    ``MultiprocessingSerializer.serialize(..., output_str=True)`` writes, read back by its
    ``SafeUnpickler`` (``python/sglang/srt/utils/common.py``); rank ``r`` reads entry ``r`` only
    (``tp_worker.deserialize_own_rank``). Separate dumps, because every read of a shared tensor
    releases one reference that its dump took. How tensors travel (both by reference, so the
    server must run on the same machine):

    * CUDA tensors as CUDA-IPC handles whose device is named by its UUID, as SGLang's senders do
      after ``monkey_patch_torch_reductions`` (``utils/patch_torch.py``): the server maps the UUID
      to its own device index, which differs when the processes see different devices.
    * CPU tensors as copies in shared memory named by file (torch's ``file_system`` strategy):
      the default strategy passes a file descriptor that only processes forked from the sender can
      receive. Each dump holds a reference to the shared memory until the server reads it.
    """
    if tp_size < 1:
        raise ValueError(f"tp_size must be >= 1, got {tp_size}")
    import torch.multiprocessing  # noqa: F401  (registers torch's reductions with ForkingPickler)

    tensors = [
        (name, tensor.detach() if tensor.is_cuda else tensor.detach().clone())
        for name, tensor in named_tensors
    ]  # CPU copies: sharing moves a storage into shared memory, so never share the caller's
    return [base64.b64encode(_dump_for_sglang(tensors)).decode() for _ in range(tp_size)]


def _dump_for_sglang(named_tensors: list[tuple[str, torch.Tensor]]) -> bytes:
    buffer = io.BytesIO()
    _SGLangPickler(buffer).dump(named_tensors)
    return buffer.getvalue()


class _SGLangPickler(ForkingPickler):
    """torch's multiprocessing reductions, but with the two changes described above."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor) and obj.is_cuda:
            return _reduce_cuda_tensor_by_uuid(obj)
        if isinstance(obj, torch.UntypedStorage) and obj.device.type == "cpu":
            return _reduce_cpu_storage_by_name(obj)
        return NotImplemented


def _reduce_cuda_tensor_by_uuid(tensor: torch.Tensor) -> tuple[Any, tuple[Any, ...]]:
    from torch.multiprocessing import reductions

    rebuild, args = reductions.reduce_tensor(tensor)
    device = args[CUDA_DEVICE_ARG]  # the argument SGLang's patch renames (index 6 since torch 2.0)
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    return rebuild, (*args[:CUDA_DEVICE_ARG], uuid, *args[CUDA_DEVICE_ARG + 1 :])


def _reduce_cpu_storage_by_name(storage: torch.UntypedStorage) -> tuple[Any, tuple[Any, ...]]:
    from torch.multiprocessing import reductions

    if storage.nbytes() == 0:  # nothing to map
        return reductions.rebuild_storage_empty, (type(storage),)
    manager, handle, size = storage._share_filename_cpu_()
    storage._shared_incref()  # released by the reader's rebuild_storage_filename
    return reductions.rebuild_storage_filename, (type(storage), manager, handle, size)


def error_body(message: str) -> dict[str, Any]:
    """SGLang's error body for a bad ``/generate``: ``{"error": {"message": ...}}`` (status 400)."""
    return {"error": {"message": message}}


def error_message(body: Any) -> str:
    """The message of an SGLang error body (``error`` as an object or a string, or ``message``)."""
    if isinstance(body, dict):
        error = body.get("error", body.get("message"))
        if isinstance(error, dict):
            return str(error.get("message", error))
        if error is not None:
            return str(error)
    return str(body)


def parse_version(value: Any) -> int:
    """An agentrl weight version from SGLang's string (``"default"`` -> 0)."""
    if value in (None, "default"):
        return 0
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ProtocolError(f"weight version {value!r} is not an agentrl version number") from None


def _finish_reason(value: Any) -> FinishReason:
    kind = value.get("type") if isinstance(value, dict) else value
    if kind not in ("stop", "length", "abort"):
        raise ProtocolError(f"unknown finish_reason {value!r}")
    return kind


def _version_spans(versions: list[int], current: int) -> list[dict[str, Any]]:
    if not versions:  # as SGLang: one empty span at the current version
        return [{"version": str(current), "start": 0, "end": 0}]
    spans: list[dict[str, Any]] = []
    for position, version in enumerate(versions):
        if spans and spans[-1]["version"] == str(version):
            spans[-1]["end"] = position + 1
        else:
            spans.append({"version": str(version), "start": position, "end": position + 1})
    return spans


def _versions_from_spans(spans: list[dict[str, Any]], length: int) -> list[int]:
    versions: list[int] = []
    for span in spans:
        # SGLang answers a request aborted before its first token with one span start == end == 0
        if span["start"] != len(versions) or span["end"] < span["start"]:
            raise ProtocolError(f"weight_versions spans are not contiguous: {spans}")
        versions += [parse_version(span["version"])] * (span["end"] - span["start"])
    if len(versions) != length:
        raise ProtocolError(f"weight_versions cover {len(versions)} tokens, not {length}")
    return versions
