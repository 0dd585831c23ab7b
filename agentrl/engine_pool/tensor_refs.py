"""SGLang's by-reference weight payloads, read on the receiving side (``agentrl serve``).

An ``/update_weights_from_tensor`` entry from an SGLang sender (SGLang's own
``MultiprocessingSerializer``, so verl's and slime's weight syncs, or agentrl's
:func:`~agentrl.engine_pool.sglang_api.sglang_tensor_payloads`) is base64 of a ``ForkingPickler``
dump: the tensors' bytes stay in the sender's memory and travel as references.

* **CPU tensors** as shared memory named by file (torch's ``file_system`` sharing strategy):
  readable by any process on the machine while the sender holds the tensors (until its call
  returns). Torch's default strategy (``file_descriptor``) passes a descriptor through
  ``multiprocessing``'s resource sharer, which only processes started from the sender (sharing its
  authkey) can reach; such a payload is refused with a message that names the switch
  (``torch.multiprocessing.set_sharing_strategy("file_system")`` in the sender).
* **CUDA tensors** as CUDA-IPC handles, their device named by index or, after SGLang's
  ``monkey_patch_torch_reductions``, by UUID (mapped to this process's index as SGLang's
  ``_device_from_maybe_uuid`` does). Only an engine with a GPU of the same machine can open them.
* **Layouts** (``load_format``): ``None``/``"direct"``, a list of ``(name, tensor)`` where a
  tensor may be SGLang's ``LocalSerializedTensor`` (one nested dump per TP rank, what
  ``sglang.srt.weight_sync.utils.update_weights`` sends and verl calls); ``"flattened_bucket"``,
  ``{"flattened_tensor", "metadata": [FlattenedTensorMetadata]}`` (SGLang's
  ``FlattenedTensorBucket``: one ``uint8`` tensor, each weight a byte range of it).

**What it guarantees**: unpickling resolves only the globals in :data:`_GLOBALS` (torch's
tensor, storage and dtype types and its multiprocessing rebuild functions; no builtins: pickle
builds the payload's strings, numbers, bytes, lists and tuples without them, so ``bytes(n)`` and
its kind cannot be called) and
SGLang's three data classes, mapped to local stand-ins, never SGLang's code: anything else
(``os.system``, ``builtins.eval``, another module's class) is refused before it is called, as
SGLang's ``SafeUnpickler`` refuses it. The result is checked to be named tensors. **What it does
not**: the references themselves are trusted: a payload may name any shared-memory file or IPC
handle of this machine that the server's user can open (torch grows a named file to the size the
payload states), and may ask for tensors as large as memory allows, as it may of SGLang; serve
on loopback (the default) or a trusted network.
"""

from __future__ import annotations

import base64
import binascii
import io
import pickle
from collections.abc import Callable
from typing import Any

import torch
from torch.multiprocessing import reductions

__all__ = [
    "CUDA_DEVICE_ARG",
    "LOAD_FORMATS",
    "ByReferenceError",
    "is_by_reference",
    "read_sglang_payload",
]

LOAD_FORMATS = (None, "direct", "flattened_bucket")
"""The ``load_format`` values ``/update_weights_from_tensor`` takes (SGLang also takes a loader's
import path, which would run code named by the client: refused)."""


CUDA_DEVICE_ARG = 6
"""The argument of torch's ``rebuild_cuda_tensor`` that names the device (``storage_device``,
index 6 since torch 2.0): SGLang's reducer patch writes the device's UUID there
(``_REDUCE_TENSOR_ARG_DEVICE_INDEX``). Both directions use it: the sender in
:mod:`agentrl.engine_pool.sglang_api`, the reader here."""


class ByReferenceError(ValueError):
    """A by-reference payload this process cannot or will not read; the message says why."""


class LocalSerializedTensor:
    """Stand-in for SGLang's class of that name: ``values[r]`` is TP rank ``r``'s own dump."""

    values: list[bytes]


class FlattenedTensorMetadata:
    """Stand-in for SGLang's class of that name: one weight's byte range of a flattened bucket."""

    name: str
    shape: torch.Size
    dtype: torch.dtype
    start_idx: int
    end_idx: int
    numel: int


def _rebuild_cuda_tensor_by_uuid(*args: Any) -> torch.Tensor:
    """SGLang's ``_rebuild_cuda_tensor_modified``: argument 6 names the device by UUID."""
    device = args[CUDA_DEVICE_ARG]
    if isinstance(device, str):
        device = next(
            (
                index
                for index in range(torch.cuda.device_count())
                if str(torch.cuda.get_device_properties(index).uuid) == device
            ),
            None,
        )
        if device is None:
            raise ByReferenceError(
                f"no CUDA device of this process has the UUID {args[CUDA_DEVICE_ARG]!r}"
            )
    rebuild: Callable[..., torch.Tensor] = reductions.rebuild_cuda_tensor
    return rebuild(*args[:CUDA_DEVICE_ARG], device, *args[CUDA_DEVICE_ARG + 1 :])


class _SharedByFileDescriptor:
    """Stands for ``DupFd`` and ``rebuild_storage_fd`` (a type: pickle builds ``DupFd`` with
    NEWOBJ); making one refuses the payload."""

    def __new__(cls, *_: Any, **__: Any) -> Any:
        raise ByReferenceError(
            "the tensors were shared by file descriptor (torch's default sharing strategy), "
            "which only a process started by the sender can receive: call "
            'torch.multiprocessing.set_sharing_strategy("file_system") in the sender, or send '
            "agentrl's portable format"
        )


_DTYPES = {name for name in dir(torch) if isinstance(getattr(torch, name), torch.dtype)}
_REBUILDS = (
    "rebuild_tensor",
    "rebuild_cuda_tensor",
    "rebuild_storage_filename",
    "rebuild_storage_empty",
    "rebuild_typed_storage",
    "rebuild_typed_storage_child",
    "rebuild_meta_tensor",
)
_WEIGHT_UPDATER = "sglang.srt.model_executor.model_runner_components.weight_updater"
_GLOBALS: dict[tuple[str, str], Any] = {
    ("torch", "Tensor"): torch.Tensor,
    ("torch.nn.parameter", "Parameter"): torch.nn.Parameter,
    ("torch", "Size"): torch.Size,
    ("torch", "device"): torch.device,
    ("torch", "UntypedStorage"): torch.UntypedStorage,
    ("torch.storage", "UntypedStorage"): torch.UntypedStorage,
    **{("torch", name): getattr(torch, name) for name in _DTYPES},
    **{("torch.multiprocessing.reductions", name): getattr(reductions, name) for name in _REBUILDS},
    ("sglang.srt.utils.patch_torch", "_rebuild_cuda_tensor_modified"): _rebuild_cuda_tensor_by_uuid,
    (_WEIGHT_UPDATER, "LocalSerializedTensor"): LocalSerializedTensor,
    ("sglang.srt.model_executor.model_runner", "LocalSerializedTensor"): LocalSerializedTensor,
    ("sglang.srt.weight_sync.tensor_bucket", "FlattenedTensorMetadata"): FlattenedTensorMetadata,
    ("torch.multiprocessing.reductions", "rebuild_storage_fd"): _SharedByFileDescriptor,
    ("multiprocessing.resource_sharer", "DupFd"): _SharedByFileDescriptor,
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Callable[..., Any]:
        found = _GLOBALS.get((module, name))
        if found is None:
            raise ByReferenceError(f"refused to unpickle {module}.{name}: not a tensor payload")
        return found


def is_by_reference(payload: bytes) -> bool:
    """Whether a decoded ``serialized_named_tensors`` entry is a pickle (SGLang's by-reference
    dump) rather than agentrl's portable ``torch.save`` archive (a zip file)."""
    return payload[:1] == b"\x80"


def read_sglang_payload(
    payload: str | bytes, load_format: str | None = None, tp_rank: int = 0
) -> list[tuple[str, torch.Tensor]]:
    """The named tensors of one ``serialized_named_tensors`` entry (``str``: base64, as on the
    wire; ``bytes``: decoded), for TP rank ``tp_rank``; :class:`ByReferenceError` says why not."""
    if load_format not in LOAD_FORMATS:
        raise ByReferenceError(
            f"load_format {load_format!r} is not served here (one of {list(LOAD_FORMATS)})"
        )
    data = _load(payload)
    if load_format == "flattened_bucket":
        return _unflatten(data)
    if not isinstance(data, list) or not all(
        isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) for item in data
    ):
        raise ByReferenceError("the payload is not a list of (name, tensor) pairs")
    named = [(name, _own_rank(value, tp_rank)) for name, value in data]
    for name, tensor in named:
        if not isinstance(tensor, torch.Tensor):
            raise ByReferenceError(f"{name!r} is a {type(tensor).__name__}, not a tensor")
    return named


def _load(payload: str | bytes) -> Any:
    if isinstance(payload, str):
        try:
            payload = base64.b64decode(payload, validate=True)
        except binascii.Error as exc:
            raise ByReferenceError(f"the payload is not base64: {exc}") from exc
    try:
        return _Unpickler(io.BytesIO(payload)).load()
    except ByReferenceError:
        raise
    except Exception as exc:  # a truncated pickle, a shared-memory file that is gone, ...
        raise ByReferenceError(f"could not read the payload: {type(exc).__name__}: {exc}") from exc


def _own_rank(value: Any, tp_rank: int) -> Any:
    if not isinstance(value, LocalSerializedTensor):
        return value
    values = getattr(value, "values", None)
    if not isinstance(values, list) or not 0 <= tp_rank < len(values):
        raise ByReferenceError(f"LocalSerializedTensor has no value for TP rank {tp_rank}")
    return _load(values[tp_rank])


def _unflatten(data: Any) -> list[tuple[str, torch.Tensor]]:
    """SGLang's ``FlattenedTensorBucket.reconstruct_tensors``: each weight a view of its range."""
    if not isinstance(data, dict) or set(data) != {"flattened_tensor", "metadata"}:
        raise ByReferenceError(
            "a flattened_bucket payload is {'flattened_tensor': tensor, 'metadata': [...]}"
        )
    flat, metadata = data["flattened_tensor"], data["metadata"]
    if not isinstance(flat, torch.Tensor) or flat.dtype != torch.uint8 or flat.dim() != 1:
        raise ByReferenceError("flattened_tensor must be a one-dimensional uint8 tensor")
    if not isinstance(metadata, list) or not all(
        isinstance(meta, FlattenedTensorMetadata) for meta in metadata
    ):
        raise ByReferenceError(
            "flattened_bucket metadata must be a list of FlattenedTensorMetadata"
        )
    try:
        return [(str(meta.name), _byte_range(flat, meta)) for meta in metadata]
    except (AttributeError, RuntimeError, TypeError) as exc:
        raise ByReferenceError(f"malformed flattened_bucket metadata: {exc}") from exc


def _byte_range(flat: torch.Tensor, meta: FlattenedTensorMetadata) -> torch.Tensor:
    if not 0 <= meta.start_idx <= meta.end_idx <= flat.numel():
        raise ByReferenceError(
            f"{meta.name!r}: bytes {meta.start_idx}:{meta.end_idx} outside the bucket's "
            f"{flat.numel()}"
        )
    return flat[meta.start_idx : meta.end_idx].view(meta.dtype).reshape(meta.shape)
