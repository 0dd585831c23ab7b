"""SGLang's by-reference payloads read in-process (tensor_refs): what loads, what is refused and
why. The server path and SGLang's and verl's own senders: test_sglang_http, test_verl_client."""

from __future__ import annotations

import io
import pickle
import sys
import types
from dataclasses import dataclass

import pytest
import torch

from agentrl.engine_pool.sglang_api import decode_named_tensors, sglang_tensor_payloads
from agentrl.engine_pool.tensor_refs import ByReferenceError, read_sglang_payload


def test_tensors_of_every_layout_come_back_equal():
    named = [
        ("t", torch.arange(6.0).reshape(2, 3).t()),  # not contiguous
        ("bf16", torch.randn(4, 5).to(torch.bfloat16)),
        ("empty", torch.zeros(0, 3)),
        ("ints", torch.arange(5)),
    ]
    (payload,) = sglang_tensor_payloads(named)
    read = decode_named_tensors(payload)  # the server's entry point picks the format itself
    assert [name for name, _ in read] == [name for name, _ in named]
    for (_, got), (_, sent) in zip(read, named, strict=True):
        assert got.dtype == sent.dtype and torch.equal(got, sent)


@pytest.fixture
def sglang_names(monkeypatch):
    """Modules named as SGLang's, so that pickle writes SGLang's global names for test objects
    (SGLang itself is not in this venv; the reader never imports it)."""

    def register(module: str, **attrs: object) -> None:
        fake = types.ModuleType(module)
        for name, value in attrs.items():
            value.__module__ = module  # type: ignore[attr-defined]
            value.__qualname__ = name  # type: ignore[attr-defined]
            setattr(fake, name, value)
        monkeypatch.setitem(sys.modules, module, fake)
        parts = module.split(".")
        for depth in range(1, len(parts)):  # pickle imports the module, so its parents too
            parent = ".".join(parts[:depth])
            if parent not in sys.modules:
                monkeypatch.setitem(sys.modules, parent, types.ModuleType(parent))

    return register


def test_a_flattened_bucket_is_split_into_its_byte_ranges(sglang_names):
    @dataclass
    class FlattenedTensorMetadata:
        name: str
        shape: torch.Size
        dtype: torch.dtype
        start_idx: int
        end_idx: int
        numel: int

    sglang_names(
        "sglang.srt.weight_sync.tensor_bucket", FlattenedTensorMetadata=FlattenedTensorMetadata
    )
    a, b = torch.randn(2, 3), torch.arange(4, dtype=torch.int64)
    flat = torch.cat([a.flatten().view(torch.uint8), b.view(torch.uint8)])
    meta = [
        FlattenedTensorMetadata("a", a.shape, a.dtype, 0, 24, 24),
        FlattenedTensorMetadata("b", b.shape, b.dtype, 24, 56, 32),
    ]
    dumped = _dump({"flattened_tensor": flat, "metadata": meta})
    (name_a, got_a), (name_b, got_b) = read_sglang_payload(dumped, "flattened_bucket")
    assert (name_a, name_b) == ("a", "b") and torch.equal(got_a, a) and torch.equal(got_b, b)
    meta[1].end_idx = 64  # past the bucket's 56 bytes
    with pytest.raises(ByReferenceError, match="outside the bucket"):
        read_sglang_payload(_dump({"flattened_tensor": flat, "metadata": meta}), "flattened_bucket")


def test_a_cuda_device_named_by_an_unknown_uuid_is_refused(sglang_names):
    """SGLang's patched reducer names the device by UUID (argument 6); the reader maps it to its
    own index and refuses one it does not have, before touching CUDA."""

    def _rebuild_cuda_tensor_modified(*args):  # never called: the reader maps the name
        raise AssertionError

    sglang_names(
        "sglang.srt.utils.patch_torch", _rebuild_cuda_tensor_modified=_rebuild_cuda_tensor_modified
    )

    class CudaHandle:
        def __reduce__(self):
            args = (torch.Tensor, (2,), (1,), 0, torch.UntypedStorage, torch.float32)
            return _rebuild_cuda_tensor_modified, (*args, "GPU-00000000-no-such-uuid", b"h", 8)

    with pytest.raises(ByReferenceError, match="no CUDA device of this process has the UUID"):
        read_sglang_payload(_dump([("w", CudaHandle())]))


@pytest.mark.parametrize(
    ("payload", "load_format", "message"),
    [
        (pickle.dumps([("w", print)]), None, r"refused to unpickle builtins\.print"),
        (pickle.dumps([("w", bytearray(3))]), None, r"refused to unpickle builtins\.bytearray"),
        (pickle.dumps([("w", 3)]), None, "'w' is a int, not a tensor"),
        (pickle.dumps([("w",)]), None, r"not a list of \(name, tensor\) pairs"),
        (pickle.dumps([])[:-2], None, "could not read the payload"),
        (pickle.dumps([]), "my.module.Loader", "load_format 'my.module.Loader' is not served"),
        (pickle.dumps({"flattened_tensor": 1}), "flattened_bucket", "a flattened_bucket payload"),
        ("%%%", None, "not base64"),
    ],
)
def test_what_is_not_a_tensor_payload_is_refused(payload, load_format, message):
    with pytest.raises(ByReferenceError, match=message):
        read_sglang_payload(payload, load_format)


def test_tensors_shared_by_file_descriptor_are_refused_with_the_switch_that_helps():
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing

    buffer = io.BytesIO()
    ForkingPickler(buffer).dump([("w", torch.ones(3))])  # the default strategy: a descriptor
    with pytest.raises(ByReferenceError, match=r'set_sharing_strategy\("file_system"\)'):
        read_sglang_payload(buffer.getvalue())


def _dump(obj: object) -> bytes:
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing

    before = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy("file_system")  # what SGLang's CPU senders need
    try:
        buffer = io.BytesIO()
        ForkingPickler(buffer).dump(obj)
        return buffer.getvalue()
    finally:
        torch.multiprocessing.set_sharing_strategy(before)
