"""The RL math: advantages (GRPO, Dr.GRPO, REINFORCE++), GAE, policy losses with their
aggregations and KL estimators, and off-policy correction. Pure functions of tensors; nothing here
imports anything else of agentrl, so a new algorithm is written and tested here alone."""
