"""OpenEnv's wire form of an AgentEnv (agentrl/envs/remote/protocol.py): the observation as
OpenEnv's serialize_observation gives it, the WebSocket envelopes, the reset data. The same
shapes against OpenEnv's own code: tests/env_server/test_openenv_protocol.py."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from agentrl.envs.remote import protocol as p


def test_observation_payload_is_openenvs_serialized_observation():
    messages = [{"role": "tool", "content": "4", "name": "python"}]
    info = {"reward_components": {"correct": np.float32(1.0)}, "pair": (1, 2), "nan": float("nan")}
    payload = p.observation_payload(messages, info, reward=np.float64(0.5), truncated=True)
    assert payload == {
        "observation": {
            "messages": messages,
            "info": {"reward_components": {"correct": 1.0}, "pair": [1, 2], "nan": None},
            "terminated": False,
            "truncated": True,
            "metadata": {},
        },
        "reward": 0.5,
        "done": True,
    }
    reset = p.observation_payload([], {"tools": []})
    assert reset["reward"] is None and reset["done"] is False
    # the wire observation plus reward and done is valid against the advertised schema
    p.AgentObservation.model_validate({**payload["observation"], "reward": 0.5, "done": True})


def test_envelopes_are_checked_as_openenv_checks_them():
    assert p.envelope({"type": "reset"}) == {}
    assert p.envelope({"type": "reset", "data": {"seed": 1}}) == {"seed": 1}
    assert p.envelope({"type": "dance"}) is None
    assert p.envelope({"type": ["reset"]}) is None
    for bad in ({"type": "step"}, {"type": "state", "data": {}}, {"type": "close", "x": 1}):
        with pytest.raises(ValidationError):
            p.envelope(bad)


def test_reset_data_extra_keys_join_the_options():
    data = p.ResetData.model_validate({"seed": 3, "index": 5, "options": {"split": "test"}})
    assert data.seed == 3 and data.env_options() == {"split": "test", "index": 5}
    assert p.ResetData.model_validate({}).env_options() is None
    with pytest.raises(ValidationError, match="seed"):
        p.ResetData.model_validate({"seed": -1})
    with pytest.raises(ValidationError, match="text"):
        p.AgentAction.model_validate({"txt": "x"})
