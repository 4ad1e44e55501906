"""Evals during training: run environments as evals on the inference servers and aggregate means,
pass@k and pass^k (see docs/rollout.md, "Evals and pass@k")."""

from telescope_rollout.evals._passk import PassKSpec, pass_at_k, pass_pow_k
from telescope_rollout.evals._runner import EvalResult, EvalRunner, EvalSpec

# the runner
__all__ = ["EvalResult", "EvalRunner", "EvalSpec"]
# the estimators
__all__ += ["PassKSpec", "pass_at_k", "pass_pow_k"]
