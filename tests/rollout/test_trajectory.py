import json

import datasets

from agentrl.rollout import Trajectory, Turn
from agentrl.tokenization import TokenTrajectory


def sample_trajectory():
    tokens = TokenTrajectory(
        input_ids=[1, 2, 3, 4],
        loss_mask=[0, 0, 1, 1],
        logprobs=[0.0, 0.0, -0.5, -1.25],
        versions=[-1, -1, 3, 3],
        prompt_length=2,
    )
    return Trajectory(
        env_id="agentrl/Math-v0",
        group=2,
        sample=1,
        seed=7,
        tokens=tokens,
        messages=[{"role": "user", "content": "2+2? ü"}, {"role": "assistant", "content": "4"}],
        turns=[Turn(2, 2, "stop", 3, 0.5, 0.01, 1.0)],
        reward=1.0,
        reward_components={"correct": 1.0, "format": 1.0},
        terminated=True,
        stop_reason="terminated",
    )


def test_record_round_trip():
    t = sample_trajectory()
    assert Trajectory.from_record(json.loads(json.dumps(t.to_record()))) == t
    t.earlier = [sample_trajectory().tokens]  # an agent's rewritten history
    assert Trajectory.from_record(json.loads(json.dumps(t.to_record()))) == t


def test_records_load_back_with_datasets(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(sample_trajectory().to_record()) + "\n" for _ in range(3)))
    ds = datasets.Dataset.from_json(str(path))
    assert len(ds) == 3 and ds[0]["input_ids"] == [1, 2, 3, 4]
    assert Trajectory.from_record(ds[0]) == sample_trajectory()
