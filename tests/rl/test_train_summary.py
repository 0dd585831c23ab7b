"""The run summary's mismatch line: over all tokens, and over those the trained weights sampled."""

from agentrl.rl.cli import mismatch_summary


def test_the_mismatch_line_names_the_on_policy_share():
    line = mismatch_summary(
        {
            "mismatch/mean_abs": 1.2e-2,
            "mismatch/on_policy_fraction": 0.4,
            "mismatch/on_policy_mean_abs": 2e-6,
        }
    )
    assert line == "1.20e-02 over all tokens, 2.00e-06 over the 40% sampled by the weights trained"


def test_a_step_without_on_policy_tokens_says_so_instead_of_nan():
    metrics = {
        "mismatch/mean_abs": 2e-3,
        "mismatch/on_policy_fraction": 0.0,
        "mismatch/on_policy_mean_abs": float("nan"),
    }
    expected = "2.00e-03 over all tokens (none sampled by the weights trained: staleness included)"
    assert mismatch_summary(metrics) == expected
    assert mismatch_summary({"mismatch/mean_abs": 2e-3}) == expected
