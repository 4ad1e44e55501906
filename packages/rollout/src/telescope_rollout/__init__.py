"""telescope-rollout: environments, rewards, chat templates, tool calls, multi-env sampling,
the inference client, vLLM server management and the async rollout engine.

It never imports torch, vllm or transformers, so other stacks can embed it; jinja2 and
tokenizers are imported only when a template is compiled or a tokenizer loaded.
"""

from telescope_rollout.__about__ import __version__
from telescope_rollout._advantage import advantage_fn_for, is_zero_advantage
from telescope_rollout._client import (
    Completion,
    InferenceClient,
    InferenceError,
    PromptTooLongError,
    ServerTimeoutError,
    ServerUnavailableError,
)
from telescope_rollout._engine import RolloutEngine, RolloutError
from telescope_rollout._env import Environment, MultiTurnEnvironment, SingleTurnEnvironment
from telescope_rollout._evals import EvalResult, EvalRunner, EvalSpec
from telescope_rollout._math import verify_math_answer
from telescope_rollout._multiturn import MultiTurnTokens, TokenTrajectory, TurnTokenizer
from telescope_rollout._passk import PassKSpec, pass_at_k, pass_pow_k
from telescope_rollout._registry import (
    BuiltEnvironment,
    UnknownEnvironmentError,
    build_environments,
    get_environment,
    list_environments,
)
from telescope_rollout._results import DroppedGroup, RolloutBatch, ScoredGroup, ScoredSample
from telescope_rollout._rubric import Rubric
from telescope_rollout._sampler import MultiEnvSampler, SamplerEntry
from telescope_rollout._sandbox import RunResult, RunResultLike, SandboxLike
from telescope_rollout._servers import (
    ServerDiedError,
    ServerGroup,
    ServerHandle,
    ServerSettings,
    ServerStartError,
    classify_failure,
    launch_server,
    port_in_use,
    server_command,
    start_servers,
)
from telescope_rollout._settings import EngineSettings
from telescope_rollout._template import ChatTemplate, TemplateError
from telescope_rollout._tokens import Tokenizer
from telescope_rollout._toolcalls import ToolCall, parse_tool_calls
from telescope_rollout._tools import ToolEnvironment
from telescope_rollout._toolschema import func_to_tool_schema
from telescope_rollout._types import (
    EvalMetricsResult,
    Message,
    RewardResult,
    RolloutState,
    Sample,
    TrajectoryStep,
)
from telescope_rollout._watch import unfit_environment
from telescope_rollout.parsers import (
    extract_answer_tags,
    extract_boxed_answer,
    extract_code_block,
    extract_last_number,
    extract_xml_tag,
    strip_think_tags,
    verify_exact_match,
)

__all__ = [
    "BuiltEnvironment",
    "ChatTemplate",
    "Completion",
    "DroppedGroup",
    "EngineSettings",
    "Environment",
    "EvalMetricsResult",
    "EvalResult",
    "EvalRunner",
    "EvalSpec",
    "InferenceClient",
    "InferenceError",
    "Message",
    "MultiEnvSampler",
    "MultiTurnEnvironment",
    "MultiTurnTokens",
    "PassKSpec",
    "PromptTooLongError",
    "RewardResult",
    "RolloutBatch",
    "RolloutEngine",
    "RolloutError",
    "RolloutState",
    "Rubric",
    "RunResult",
    "RunResultLike",
    "Sample",
    "SamplerEntry",
    "SandboxLike",
    "ScoredGroup",
    "ScoredSample",
    "ServerDiedError",
    "ServerGroup",
    "ServerHandle",
    "ServerSettings",
    "ServerStartError",
    "ServerTimeoutError",
    "ServerUnavailableError",
    "SingleTurnEnvironment",
    "TemplateError",
    "TokenTrajectory",
    "Tokenizer",
    "ToolCall",
    "ToolEnvironment",
    "TrajectoryStep",
    "TurnTokenizer",
    "UnknownEnvironmentError",
    "__version__",
    "advantage_fn_for",
    "build_environments",
    "classify_failure",
    "extract_answer_tags",
    "extract_boxed_answer",
    "extract_code_block",
    "extract_last_number",
    "extract_xml_tag",
    "func_to_tool_schema",
    "get_environment",
    "is_zero_advantage",
    "launch_server",
    "list_environments",
    "parse_tool_calls",
    "pass_at_k",
    "pass_pow_k",
    "port_in_use",
    "server_command",
    "start_servers",
    "strip_think_tags",
    "unfit_environment",
    "verify_exact_match",
    "verify_math_answer",
]
