"""Evaluation of a policy: every task of its environments, ``k`` samples each, pass@k.

:mod:`.config` (``EvalConfig``), :mod:`.policy` (the model or run checkpoint served), :mod:`.run`
(running and resuming), :mod:`.report` (the numbers), :mod:`.passk` (the estimator), :mod:`.cli`
(``agentrl eval``).
"""

from agentrl.evaluation.config import EvalConfig
from agentrl.evaluation.passk import pass_at_k
from agentrl.evaluation.report import summarize
from agentrl.evaluation.run import evaluate

__all__ = ["EvalConfig", "evaluate", "pass_at_k", "summarize"]
