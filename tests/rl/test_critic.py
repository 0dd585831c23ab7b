"""The critic of PPO with GAE: the clipped value loss by hand, the value model, values aligned
with log-probs in packed batches, whitened GAE advantages over multi-turn masks, critic updates,
and whole runs with ``algorithm.advantage=gae`` that checkpoint and resume the critic.

float32 results are compared with float64 ones within the tolerance the float32 reference's own
distance from float64 gives on this CPU (tests/float_tolerance.py)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from float_tolerance import assert_within, float32_tolerance, tolerance
from fsdp_worker import one_process_group, tiny_llama
from test_loop import mismatch_bound, tiny_config, train

from agentrl.algorithms.gae import gae_reference
from agentrl.algorithms.losses import value_loss
from agentrl.config import ConfigError
from agentrl.rl.config import AlgorithmConfig, TrainConfig
from agentrl.rl.critic import (
    Critic,
    CriticConfig,
    load_value_model,
    packed_values,
    value_model_from_policy,
    whitening,
)
from agentrl.rl.loop import train_on_batch
from agentrl.rl.objective import Objective
from agentrl.training.actor import Actor
from agentrl.training.checkpoint import CheckpointManager
from agentrl.training.distributed import DistInfo
from agentrl.training.metrics import read_metrics
from agentrl.training.packing import pack_for_rank

# Sequences with holes in the loss mask, as multi-turn trajectories have (tool results, the next
# user turn): (length, loss-token spans, reward).
SEQUENCES = [
    (9, [(3, 5), (7, 9)], 1.0),
    (6, [(2, 6)], 0.0),
    (11, [(2, 4), (6, 7), (8, 11)], 1.0),
    (5, [(3, 5)], 0.0),
]
GAMMA, LAM = 0.9, 0.8


@pytest.fixture(scope="module")
def dist_info() -> Iterator[DistInfo]:
    with one_process_group() as info:
        yield info


def value_model(head_seed: int | None = 3) -> torch.nn.Module:
    """The tiny Llama's value model; a random head (not zero) so that values differ."""
    model = value_model_from_policy(tiny_llama(), "sdpa")
    if head_seed is not None:
        generator = torch.Generator().manual_seed(head_seed)
        with torch.no_grad():
            model.score.weight.copy_(torch.randn(model.score.weight.shape, generator=generator))
            model.score.bias.fill_(0.1)
    return model


def sequences() -> list[dict[str, Any]]:
    generator = torch.Generator().manual_seed(5)
    out = []
    for length, spans, reward in SEQUENCES:
        mask = [0] * length
        for start, end in spans:
            mask[start:end] = [1] * (end - start)
        rewards = [0.0] * length
        rewards[max(i for i, m in enumerate(mask) if m)] = reward
        out.append(
            {
                "input_ids": torch.randint(0, 64, (length,), generator=generator).tolist(),
                "loss_mask": mask,
                "logprobs": [0.0] * length,
                "versions": [0] * length,
                "advantages": 0.0,
                "token_rewards": rewards,
            }
        )
    return out


def test_the_clipped_value_loss_by_hand() -> None:
    values = torch.tensor([[1.0, 2.4, 7.0]], requires_grad=True)
    old = torch.tensor([[0.5, 2.5, 0.0]])
    returns = torch.tensor([[2.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, metrics = value_loss(values, old, returns, mask, clip=0.2)
    # token 0: V 1.0 may move to 0.7 at most: max((1 - 2)^2, (0.7 - 2)^2) = 1.69, clipped
    # token 1: V 2.4 is inside [2.3, 2.7]: (2.4 - 1)^2 = 1.96 either way; token 2 is off the mask
    assert loss.item() == pytest.approx(0.5 * (1.69 + 1.96) / 2)
    assert float(metrics["clip_fraction"]) == pytest.approx(0.5)
    loss.backward()
    # the clipped token gets no gradient; the other 0.5 * 2 * (2.4 - 1) / 2
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, 0.7, 0.0]]))
    plain, _ = value_loss(values, old, returns, mask, clip=None)
    assert plain.item() == pytest.approx(0.5 * (1.0 + 1.96) / 2)
    with pytest.raises(ValueError, match="value clip"):
        value_loss(values, old, returns, mask, clip=0.0)


def test_the_value_model_starts_from_the_policy_with_a_zero_head(tiny_policy_dir, tmp_path) -> None:
    policy = tiny_llama()
    model = value_model_from_policy(policy, "sdpa")
    assert type(model).__name__ == "LlamaForTokenClassification"
    assert model.config.num_labels == 1 and model.dropout.p == 0.0
    for name, tensor in policy.model.state_dict().items():
        assert torch.equal(model.model.state_dict()[name], tensor), name
    assert not model.score.weight.any() and not model.score.bias.any()
    loaded = load_value_model(tiny_policy_dir, "sdpa")  # a causal LM's directory: no head
    assert not loaded.score.weight.any()
    trained = value_model()  # a head with weights survives a save and load
    trained.save_pretrained(tmp_path / "critic")
    again = load_value_model(tmp_path / "critic", "sdpa")
    assert torch.equal(again.score.weight, trained.score.weight)


def test_packed_values_are_those_of_each_sequence_alone() -> None:
    model = value_model().eval()
    rows = sequences()
    (batch,) = pack_for_rank(rows, 0, 1, max_tokens=64)
    model64 = value_model().double().eval()
    with torch.no_grad():
        packed = packed_values(model, batch)  # (1, T)
        for segment, index in zip(batch.unpack(packed), batch.sequence_index, strict=True):
            ids = torch.tensor(rows[index]["input_ids"])[None]
            alone = model(input_ids=ids).logits[0, :, 0]  # (L,) the head at every position
            exact = model64(input_ids=ids).logits[0, :, 0]
            # entry t: the state before token t, the head at t - 1; 0 at the first token
            expected = torch.cat([torch.zeros(1), exact[:-1]])
            assert_within(segment, expected, float32_tolerance(alone, exact))


def test_prepare_gives_whitened_gae_over_the_loss_tokens(dist_info) -> None:
    model = value_model()
    critic = Critic(Actor(model, CriticConfig(), dist_info=dist_info), gamma=GAMMA, lam=LAM)
    rows = sequences()
    parts = [pack_for_rank(rows[k::2], 0, 1, max_tokens=16) for k in range(2)]  # 2 mini-batches
    prepared, metrics = critic.prepare(parts)
    masks = {index: row["loss_mask"] for index, row in enumerate(rows)}

    def expected(reference: torch.nn.Module) -> tuple[dict[int, Any], float]:
        """Whitened advantages and returns per row from ``reference``'s values (in float64), and
        the advantages' mean before whitening."""
        advantages, returns = {}, {}
        for index, row in enumerate(rows):
            with torch.no_grad():
                head = reference(input_ids=torch.tensor(row["input_ids"])[None]).logits[0, :, 0]
            values = [0.0, *head[:-1].tolist()]
            advantages[index], returns[index] = gae_reference(
                row["token_rewards"], values, gamma=GAMMA, lam=LAM, mask=row["loss_mask"]
            )
        on_mask = [a for i in advantages for a, m in zip(advantages[i], masks[i], strict=True) if m]
        x = torch.tensor(on_mask, dtype=torch.float64)
        mean, std = float(x.mean()), float(x.std())  # Bessel-corrected, as verl's masked_whiten
        return {
            index: (
                (torch.tensor(advantages[index]) - mean) / (std**2 + 1e-8) ** 0.5,
                torch.tensor(returns[index], dtype=torch.float64),
            )
            for index in advantages
        }, mean

    # the same weights, unsharded: in float32 (as the critic computes) and float64 (exact)
    float32, near_mean = expected(value_model().eval())
    exact, mean = expected(value_model().double().eval())
    mean_atol = tolerance(abs(near_mean - mean), mean)
    assert metrics["advantage/mean"] == pytest.approx(mean, abs=mean_atol)
    seen = set()
    for k, part in enumerate(prepared):
        for batch in part:
            fields = [batch.unpack(batch.fields[f]) for f in ("advantages", "returns")]
            for local, adv, ret in zip(batch.sequence_index, *fields, strict=True):
                if local < 0:  # a filler
                    continue
                index = k + 2 * local  # part k holds rows[k::2]
                seen.add(index)
                mask = torch.tensor(masks[index], dtype=torch.float64)
                (want, want_ret), (near, near_ret) = exact[index], float32[index]
                assert_within(adv, want * mask, float32_tolerance(near * mask, want * mask))
                assert_within(ret, want_ret, float32_tolerance(near_ret, want_ret))
    assert seen == set(range(len(rows)))
    # environment tokens inside a trajectory carry no advantage: the chain skips them
    assert metrics["critic/explained_variance"] < 1


def test_whitening_of_empty_masks_is_defined() -> None:
    mean, scale = whitening([torch.zeros(2, 3)], [torch.zeros(2, 3)])
    assert mean == 0.0 and scale == pytest.approx(1e4)


def test_critic_updates_fit_the_returns_and_clip(dist_info) -> None:
    algorithm = AlgorithmConfig(advantage="gae", gamma=GAMMA, lam=LAM, mini_batches=2, epochs=2)
    actor = Actor(tiny_llama(), dist_info=dist_info)
    critic = Critic(
        Actor(
            value_model(head_seed=None), CriticConfig(lr=3e-3, value_clip=0.05), dist_info=dist_info
        ),
        gamma=GAMMA,
        lam=LAM,
        value_clip=0.05,
    )
    objective = Objective(algorithm, temperature=1.0)
    reports = [
        train_on_batch(
            actor,
            objective,
            sequences(),
            micro_batch_tokens=16,
            mini_batches=2,
            epochs=2,
            critic=critic,
        )
        for _ in range(12)
    ]
    assert actor.step == critic.actor.step == 12  # one trainer step each, 4 optimizer steps
    first, last = reports[0], reports[-1]
    assert first["critic/old_values_mean"] == 0.0  # the zero head
    assert last["critic/loss"] < 0.5 * first["critic/loss"]
    assert last["critic/explained_variance"] > first["critic/explained_variance"]
    # with 4 updates per step the predictions leave the 0.05 band and the clip acts
    assert max(r["critic/clip_fraction"] for r in reports) > 0
    for key in ("critic/grad_norm", "critic/lr", "critic/values_mean", "advantage/abs_mean"):
        assert key in last, key


def test_gae_configuration_is_checked() -> None:
    config = TrainConfig.load(None, ["algorithm.advantage=gae", "critic.lr=3e-5"])
    assert config.critic.lr == 3e-5 and config.critic.value_clip == 0.5
    with pytest.raises(ConfigError, match=r"critic\.lr set with algorithm\.advantage=grpo"):
        TrainConfig.load(None, ["critic.lr=3e-5"])
    with pytest.raises(ConfigError, match=r"algorithm\.gamma set with algorithm\.advantage=grpo"):
        TrainConfig.load(None, ["algorithm.gamma=0.9"])
    with pytest.raises(ConfigError, match=r"critic\.value_klip: unknown key"):
        TrainConfig.load(None, ["algorithm.advantage=gae", "critic.value_klip=0.2"])


@pytest.mark.slow
async def test_a_gae_run_checkpoints_and_resumes_its_critic(tiny_policy_dir, tmp_path) -> None:
    # two PPO mini-batches a step: the full Trainer path of several optimizer steps per step
    gae = (
        "algorithm.advantage=gae",
        "algorithm.lam=0.95",
        "critic.lr=1e-3",
        "algorithm.mini_batches=2",
    )
    await train(tiny_config(tiny_policy_dir, tmp_path / "a", *gae, "trainer.steps=3"))
    await train(tiny_config(tiny_policy_dir, tmp_path / "b", *gae, "trainer.steps=2"))
    resumed, summary = await train(
        tiny_config(tiny_policy_dir, tmp_path / "b", *gae, "trainer.steps=3")
    )
    assert summary.final_step == 3 and resumed.critic.actor.step == 3
    rows_a = read_metrics(tmp_path / "a" / "metrics.jsonl")
    rows_b = read_metrics(tmp_path / "b" / "metrics.jsonl")
    # step 3 of both: the same batch on the same policy and critic weights (the resumed run took
    # them from its checkpoint). The critic's metrics depend on tokens, rewards and critic weights
    # only: float32's spacing (``FACTOR`` of it) where the same computation could round otherwise.
    for key in ("critic/loss", "critic/old_values_mean"):
        assert rows_b[-1][key] == pytest.approx(
            rows_a[-1][key], abs=tolerance(0.0, rows_a[-1][key])
        )
    # The policy loss also on the engine's log-probs, which may differ by float32 rounding (which
    # step 1, engine and trainer holding the same weights, measured): a token mean of -A * w * r
    # (r = 1 in value, TIS w <= cap, whitened GAE |A| <= sqrt(n - 1) over n loss tokens) whose
    # terms each move by at most their size times expm1(2 * bound).
    bound = mismatch_bound(rows_a[0]["mismatch/max_abs"], tiny_policy_dir)
    tokens = rows_a[-1]["batch/loss_tokens"]
    term = math.sqrt(tokens - 1) * resumed.config.algorithm.importance_cap
    loss_atol = term * math.expm1(2 * bound) + tolerance(0.0, term)
    assert rows_b[-1]["train/loss"] == pytest.approx(rows_a[-1]["train/loss"], abs=loss_atol)
    assert rows_a[0]["critic/old_values_mean"] == 0.0 and rows_a[-1]["critic/old_values_mean"] != 0
    assert all(row["train/optimizer_steps"] == 2 for row in rows_a)
    exported = load_value_model(tmp_path / "a" / "hf_critic", "sdpa")
    assert exported.score.weight.any()  # the trained head, loadable as critic.path


def test_a_checkpoint_without_a_critic_is_refused_by_a_gae_run(dist_info, tmp_path) -> None:
    actor = Actor(tiny_llama(), dist_info=dist_info)
    manager = CheckpointManager(tmp_path)
    path = manager.save(actor, {})
    critic = Actor(value_model(), CriticConfig(), dist_info=dist_info)
    with pytest.raises(ValueError, match="holds no critic"):
        manager.load(path, Actor(tiny_llama(), dist_info=dist_info), critic=critic)
