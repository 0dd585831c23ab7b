"""Generation engines behind one protocol; see `agentrl.engine_pool.engine` for the contract.

``LocalEngine`` (the embedded PyTorch engine), ``SGLangEngine`` (SGLang's HTTP API, or
``agentrl serve``) and ``EnginePool`` (routing, retries, health, weight updates over many engines)
are imported on first use, so that code needing only the protocol types does not import them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentrl.engine_pool.engine import (
    Engine,
    EngineError,
    FinishReason,
    GenerateResult,
    SamplingParams,
    check_input_ids,
)

if TYPE_CHECKING:
    from agentrl.engine_pool.local_engine import EngineStats, LocalEngine
    from agentrl.engine_pool.pool import EnginePool
    from agentrl.engine_pool.sglang_engine import SGLangEngine

_LAZY = {
    "LocalEngine": "agentrl.engine_pool.local_engine",
    "EngineStats": "agentrl.engine_pool.local_engine",
    "EnginePool": "agentrl.engine_pool.pool",
    "SGLangEngine": "agentrl.engine_pool.sglang_engine",
}

__all__ = [
    "Engine",
    "EngineError",
    "EnginePool",
    "EngineStats",
    "FinishReason",
    "GenerateResult",
    "LocalEngine",
    "SGLangEngine",
    "SamplingParams",
    "check_input_ids",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agentrl.engine_pool' has no attribute {name!r}")
