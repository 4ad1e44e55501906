"""The environment API: how a task is written, scored and found by name; and the built-in tasks.

Write a task by subclassing :class:`SingleTurnEnvironment`, :class:`MultiTurnEnvironment` or
:class:`ToolEnvironment`, or train an agent written against the OpenAI API
(:class:`AgentEnvironment`, or :class:`CommandAgentEnvironment` for a program run in the
sandbox); score it with a :class:`Rubric` of reward functions (and the answer
parsers of :mod:`telescope_rollout.parsers`). Environments that run code receive any
:class:`SandboxLike`. Names resolve through the registry (``get_environment``): a ``module:Class``
path, an entry point in the group ``telescope.environments``, or a built-in. The built-ins are the
modules ``telescope_rollout.envs.<name>`` (countdown, boxed_math, wordle, i3_code, quickstart_add,
evals). See docs/rollout.md, "The environment API".
"""

from telescope_rollout._types import (
    EvalMetricsResult,
    Message,
    RewardResult,
    RolloutState,
    Sample,
    TrajectoryStep,
)
from telescope_rollout.envs._agent import (
    AgentEndpoint,
    AgentEnvironment,
    AgentEpisode,
    AgentError,
    CommandAgentEnvironment,
)
from telescope_rollout.envs._env import Environment, MultiTurnEnvironment, SingleTurnEnvironment
from telescope_rollout.envs._math import verify_math_answer
from telescope_rollout.envs._registry import (
    BuiltEnvironment,
    UnknownEnvironmentError,
    build_environments,
    get_environment,
    list_environments,
)
from telescope_rollout.envs._rubric import Rubric
from telescope_rollout.envs._sandbox import (
    CommandResultLike,
    CommandSandboxLike,
    RunResult,
    RunResultLike,
    SandboxLike,
)
from telescope_rollout.envs._toolcalls import ToolCall, parse_tool_calls
from telescope_rollout.envs._tools import ToolEnvironment
from telescope_rollout.envs._toolschema import func_to_tool_schema

# base classes
__all__ = [
    "AgentEnvironment",
    "CommandAgentEnvironment",
    "Environment",
    "MultiTurnEnvironment",
    "SingleTurnEnvironment",
    "ToolEnvironment",
]
# agents on the OpenAI API
__all__ += ["AgentEndpoint", "AgentEpisode", "AgentError"]
# what they exchange
__all__ += ["EvalMetricsResult", "Message", "RewardResult", "RolloutState", "Sample", "TrajectoryStep"]
# scoring
__all__ += ["Rubric", "verify_math_answer"]
# tools and code
__all__ += [
    "CommandResultLike",
    "CommandSandboxLike",
    "RunResult",
    "RunResultLike",
    "SandboxLike",
    "ToolCall",
    "func_to_tool_schema",
    "parse_tool_calls",
]
# by name
__all__ += [
    "BuiltEnvironment",
    "UnknownEnvironmentError",
    "build_environments",
    "get_environment",
    "list_environments",
]
