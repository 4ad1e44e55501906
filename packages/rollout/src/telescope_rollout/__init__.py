"""telescope-rollout: environments, rewards, chat templates, the inference client, the async
rollout engine and evals.

It never imports torch, vllm or transformers, so other stacks can embed it; jinja2 and
tokenizers are imported only when a template is compiled or a tokenizer loaded. The names below
are the ones most programs need; every room has the rest: ``telescope_rollout.envs`` (the
environment API and the built-ins), ``.chat``, ``.inference``, ``.engine``, ``.evals``, plus the
namespaces ``.parsers`` (answer parsing) and ``.testing`` (fakes and torch-free advantages).
"""

from telescope_rollout.__about__ import __version__
from telescope_rollout._types import Message, RewardResult, RolloutState, Sample
from telescope_rollout.chat import ChatTemplate, TemplateError, Tokenizer
from telescope_rollout.engine import (
    DroppedGroup,
    EngineSettings,
    MultiEnvSampler,
    RolloutBatch,
    RolloutEngine,
    RolloutError,
    SamplerEntry,
    ScoredGroup,
    ScoredSample,
)
from telescope_rollout.envs import (
    AgentEnvironment,
    CommandAgentEnvironment,
    Environment,
    MultiTurnEnvironment,
    Rubric,
    SandboxLike,
    SingleTurnEnvironment,
    ToolEnvironment,
    UnknownEnvironmentError,
    build_environments,
    get_environment,
    list_environments,
)
from telescope_rollout.evals import EvalResult, EvalRunner, EvalSpec
from telescope_rollout.inference import InferenceClient, InferenceError

__all__ = ["__version__"]
# the environment API
__all__ += [
    "AgentEnvironment",
    "CommandAgentEnvironment",
    "Environment",
    "Message",
    "MultiTurnEnvironment",
    "RewardResult",
    "RolloutState",
    "Rubric",
    "Sample",
    "SandboxLike",
    "SingleTurnEnvironment",
    "ToolEnvironment",
    "build_environments",
    "get_environment",
    "list_environments",
]
# chat
__all__ += ["ChatTemplate", "Tokenizer"]
# inference
__all__ += ["InferenceClient"]
# engine
__all__ += [
    "DroppedGroup",
    "EngineSettings",
    "MultiEnvSampler",
    "RolloutBatch",
    "RolloutEngine",
    "SamplerEntry",
    "ScoredGroup",
    "ScoredSample",
]
# evals
__all__ += ["EvalResult", "EvalRunner", "EvalSpec"]
# errors
__all__ += ["InferenceError", "RolloutError", "TemplateError", "UnknownEnvironmentError"]
