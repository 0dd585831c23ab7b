"""Generation engines behind one protocol; see `agentrl.engine_pool.engine` for the contract.

``LocalEngine`` (the embedded PyTorch engine) is imported on first use, so that code needing only
the protocol types does not import transformers.
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

__all__ = [
    "Engine",
    "EngineError",
    "EngineStats",
    "FinishReason",
    "GenerateResult",
    "LocalEngine",
    "SamplingParams",
    "check_input_ids",
]


def __getattr__(name: str) -> Any:
    if name in ("LocalEngine", "EngineStats"):
        from agentrl.engine_pool import local_engine

        return getattr(local_engine, name)
    raise AttributeError(f"module 'agentrl.engine_pool' has no attribute {name!r}")
