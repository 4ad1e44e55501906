"""The tables of a run's record: columns, types, units, meanings and schema versions.

This module is the record format in code; ``docs/records.md`` is the same in prose, and a test
holds the two equal. A table's ``version`` goes up whenever a column is added, removed, renamed
or changes meaning; readers check it in ``records/manifest.json`` (see ``_files``).

Times are wall-clock seconds since the Unix epoch (``time.time()``), durations are seconds.
``attempt`` counts the starts of a run: 0 for the first, one more for each resume.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from telescope_records import _arrow as arrow

__all__ = ["FORMAT_VERSION", "TABLES", "Column", "Table", "table"]

FORMAT_VERSION = 1
"""The version of the layout of ``records/`` (file names, manifest), not of any one table."""

Key = Literal["step", "attempt", "time"]

STR = arrow.string()
I32 = arrow.int32()
I64 = arrow.int64()
F64 = arrow.float64()
BOOL = arrow.bool_()
NUM_MAP = arrow.map_(arrow.string(), arrow.float64())
STR_MAP = arrow.map_(arrow.string(), arrow.string())
F32_LIST = arrow.list_(arrow.float32())
I32_LIST = arrow.list_(arrow.int32())
STR_LIST = arrow.list_(arrow.string())


@dataclass(frozen=True)
class Column:
    """One column: its name, Arrow type, meaning (with the unit) and the longest text it keeps."""

    name: str
    type: arrow.DataType
    meaning: str
    max_chars: int = 0
    """Strings longer than this are cut and marked (see ``_rows.TRUNCATION_MARK``); 0 = 200,000."""


@dataclass(frozen=True)
class Table:
    """One table of the record; ``key`` says how its files are named and when they are written."""

    name: str
    version: int
    key: Key
    doc: str
    columns: tuple[Column, ...]

    def schema(self) -> arrow.Schema:
        return arrow.schema([arrow.field(c.name, c.type, nullable=True) for c in self.columns])

    def column(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)


def _c(name: str, type_: arrow.DataType, meaning: str, max_chars: int = 0) -> Column:
    return Column(name, type_, meaning, max_chars)


ATTEMPT = _c("attempt", I32, "run attempt: 0 for the first start, +1 per resume")
STEP = _c("step", I64, "training step (from 1) whose batch the row belongs to")
SOURCE = _c("source", STR, "`train`, or `eval:<eval name>` for an eval sample")
SAMPLE_ID = _c("sample_id", I64, "the sample's id, unique within a source and attempt")
VERSION_START = _c("version_start", I64, "weight version live on the server when generation started")
VERSION_END = _c("version_end", I64, "weight version live on the server when generation ended")
METRICS = _c("metrics", NUM_MAP, "each reward metric of the environment (eval: with pass@k / pass^k)")
GOLDEN = _c("golden_answers", STR_MAP, "the reference answer per metric")
TAGS = _c("tags", STR_MAP, "the environment's categorical tags of the sample")
INFO = _c("info", STR, "the environment's info rows (`info_turns`) as a JSON list", 65_536)

_SAMPLE_TEXT = (
    _c("prompt", STR, "the prompt as sent: chat template applied, decoded"),
    _c("system_prompt", STR, "the system message of the prompt, or empty"),
    _c("prompt_tokens", I32, "tokens of the prompt (first turn)"),
    _c("completion", STR, "every turn after the prompt, decoded (multi-turn: environment turns too)"),
    _c("completion_tokens", I32, "tokens after the prompt (multi-turn: environment tokens too)"),
    _c("num_turns", I32, "model turns"),
    _c("stop_reason", STR, "vLLM's finish reason (single turn) or the episode's stop reason"),
    _c("truncated", BOOL, "cut off by max_tokens or the context"),
)
_SAMPLE_OUTCOME = (METRICS, GOLDEN, TAGS, INFO)
_SAMPLE_TIMES = (
    _c("server", STR, "URL of the inference server of its (first) generation"),
    _c("error", STR, "the error kind when it failed (rollout_error, sample_error, ...), else null"),
    _c("error_detail", STR, "the error's message", 8_192),
    _c("queue_s", F64, "seconds from its group's dispatch to its first request"),
    _c("generation_s", F64, "seconds generating (every turn, environment steps included)"),
    _c("reward_s", F64, "seconds in compute_reward"),
    _c("dispatched_at", F64, "wall clock when its group was dispatched (unix s)"),
    _c(
        "finished_at",
        F64,
        "wall clock when its reward was computed or it stopped (unix s); null when unknown",
    ),
)

SAMPLES = Table(
    "samples",
    2,
    "step",
    "Every training sample, kept, discarded or cancelled, with its reason: one row per completion.",
    (
        ATTEMPT,
        STEP,
        _c("status", STR, "`kept`, `discarded` or `cancelled`"),
        _c(
            "reason",
            STR,
            "why it was not kept (zero_advantage, max_async, off_policy, eval_drain, server_restart, "
            "an error kind)",
        ),
        _c("env", STR, "the environment (config entry name)"),
        _c("group_id", I64, "its group (one prompt, group_size completions)"),
        SAMPLE_ID,
        _c("sample_index", I64, "the prompt's index in its environment's dataset"),
        *_SAMPLE_TEXT,
        _c("model_tokens", I32, "tokens the model generated (the trained ones)"),
        _c("reward", F64, "the reward trained on (after reward shaping)"),
        _c("advantage", F64, "the advantage of the group stage (before batch whitening)"),
        *_SAMPLE_OUTCOME,
        VERSION_START,
        VERSION_END,
        _c("off_policy_steps", I32, "weight updates that happened while it generated"),
        _c("lane", I32, "the server lane it ran in, -1 if none"),
        *_SAMPLE_TIMES,
        _c(
            "trainer_input",
            STR,
            "kept samples: prompt and completion ids decoded as the trainer got them (each further "
            "sequence after a line `--- sequence <k>: <reason> ---`)",
        ),
        _c(
            "sequences",
            I32,
            "training sequences it made: 1, more when an agent rewrote its history (each trained with "
            "its advantage)",
        ),
        _c(
            "split_reasons",
            STR,
            "why each sequence after the first began, comma separated (tools_changed, resent, "
            "assistant_edited@i, history_rewritten@i, history_truncated, endpoint_changed; i counts "
            "messages, or tokens for /completions); empty for one",
        ),
    ),
)

TOKENS = Table(
    "tokens",
    1,
    "step",
    "What became of every completion token of the kept samples: one row per training sequence, one list "
    "entry per token (record_tokens).",
    (
        ATTEMPT,
        STEP,
        _c("env", STR, "the environment (config entry name)"),
        _c("group_id", I64, "its sample's group"),
        SAMPLE_ID,
        _c("sequence", I32, "the sample's training sequence: 0, or k for its further sequence k"),
        _c("token_ids", I32_LIST, "the completion's token ids (model and environment tokens)"),
        _c(
            "token_text", STR_LIST, "each token decoded on its own (a character split over tokens shows as �)"
        ),
        _c("sampler_logprob", F32_LIST, "vLLM's logprob of each token as sampled (0 where not generated)"),
        _c(
            "trainer_logprob",
            F32_LIST,
            "the logprob the trainer's loss used; NaN where not computed (cut by seq_len, or not recorded)",
        ),
        _c("teacher_logprob", F32_LIST, "the teacher's logprob of each token; null without a teacher"),
        _c("ref_logprob", F32_LIST, "the reference model's logprob; null without a reference model"),
        _c(
            "advantage",
            F32_LIST,
            "the advantage the loss used (whitened; algorithm opd: with its teacher term)",
        ),
        _c(
            "loss_mask",
            F32_LIST,
            "1 where the token counted in the loss (after filters and sequence IS masking)",
        ),
        _c("is_weight", F32_LIST, "the token's TIS weight (1 without TIS, and outside the loss)"),
        _c("clipped", F32_LIST, "-1 where the ratio was clipped at the lower bound, +1 at the upper; 0 else"),
        _c(
            "version_start",
            I32_LIST,
            "weight version live on the server when the token's model turn was sent; -1: not generated",
        ),
        _c(
            "version_end",
            I32_LIST,
            "weight version live when that turn's answer came back (above version_start: updated mid-turn)",
        ),
    ),
)

EVAL_SAMPLES = Table(
    "eval_samples",
    1,
    "step",
    "Every completion of an eval: rows of one prompt share (eval, step, sample_index) (the pass@k group).",
    (
        ATTEMPT,
        _c("step", I64, "the training step whose weights were evaluated (0 = the base model)"),
        _c("eval", STR, "the eval's name"),
        _c("env", STR, "the environment it evaluates"),
        _c("sample_index", I64, "the prompt's index in the eval's dataset (the pass@k group)"),
        _c("completion_idx", I32, "which of the prompt's completions (0 .. max k - 1)"),
        SAMPLE_ID,
        *_SAMPLE_TEXT,
        *_SAMPLE_OUTCOME,
        *_SAMPLE_TIMES,
    ),
)

TURNS = Table(
    "turns",
    2,
    "step",
    "Every model turn and environment response of every sample, in order.",
    (
        ATTEMPT,
        STEP,
        SOURCE,
        SAMPLE_ID,
        _c("turn_index", I32, "position in the episode, from 0 (model and environment turns alternate)"),
        _c("role", STR, "`model` or `env`"),
        _c(
            "turn_type",
            STR,
            "`generation`, or the environment's kind: env_response, tool_result, feedback, context",
        ),
        _c("text", STR, "what was generated or answered"),
        _c("tokens", I32, "tokens of the turn (-1 where unknown)"),
        _c("prompt_tokens", I32, "model turns: tokens sent with the request; -1 for environment turns"),
        _c("stop_reason", STR, "model turns: vLLM's finish reason"),
        _c("server", STR, "model turns: the server's URL"),
        VERSION_START,
        VERSION_END,
        _c("started_at", F64, "wall clock when the request was sent / the environment was called (unix s)"),
        _c("ended_at", F64, "wall clock when it returned (unix s)"),
        _c("request_id", STR, "model turns: the request id sent to vLLM"),
        _c("queue_s", F64, "vLLM's queue time, where the server reports it (else null)"),
        _c("ttft_s", F64, "vLLM's time to first token, where reported"),
        _c("prefill_s", F64, "vLLM's prefill time, where reported"),
        _c("decode_s", F64, "vLLM's decode time, where reported"),
        _c("e2e_s", F64, "the request's round trip measured by the client"),
        _c("segment", I32, "the sample's training sequence it is in: 0, or k for its sequence k + 1"),
    ),
)

TOOL_CALLS = Table(
    "tool_calls",
    2,
    "step",
    "Every tool call of every sample.",
    (
        ATTEMPT,
        STEP,
        SOURCE,
        SAMPLE_ID,
        _c("turn_index", I32, "the model turn (counted over model turns, from 0) that made the call"),
        _c("call_index", I32, "position among the sample's calls, from 0"),
        _c("name", STR, "the tool's name"),
        _c("arguments", STR, "the arguments as JSON text", 65_536),
        _c("raw_text", STR, "the call as the model wrote it", 65_536),
        _c("result", STR, "what the tool returned", 65_536),
        _c("success", BOOL, "the call parsed and the tool ran without error"),
        _c("error", STR, "the parse or tool error", 8_192),
        _c("exit_code", I32, "exit code of the program the tool ran in a sandbox, where there is one"),
        _c("started_at", F64, "wall clock when the tool started (unix s)"),
        _c("duration_s", F64, "seconds the tool took"),
        _c("sandbox", STR, "the sandbox it ran in, or empty"),
        _c("truncated", BOOL, "arguments, raw text or result were cut (by the environment or the record)"),
        _c("call_id", STR, "agents: the call's OpenAI id (`call_<k>_<i>`), which the tool result names"),
    ),
)

ROLLOUT_EVENTS = Table(
    "rollout_events",
    1,
    "step",
    "The lifecycle of every sample on a timeline: one row per phase (a point event: started_at = ended_at).",
    (
        ATTEMPT,
        STEP,
        SOURCE,
        SAMPLE_ID,
        _c("group_id", I64, "its group (-1 for eval samples)"),
        _c(
            "event",
            STR,
            "dispatched, generation, env_response, tool_execution, reward, kept, discarded, cancelled",
        ),
        _c("started_at", F64, "wall clock (unix s)"),
        _c("ended_at", F64, "wall clock (unix s)"),
        _c("server", STR, "generation: the server's URL"),
        _c("lane", I32, "the lane of the sample, -1 if none"),
        _c("turn_index", I32, "generation / env_response: the turn; tool_execution: the call; else -1"),
        _c("detail", STR, "the reason of a discard or cancel, the tool's name, ..."),
    ),
)

ORCHESTRATOR_EVENTS = Table(
    "orchestrator_events",
    1,
    "step",
    "What the driver did and when: start-up phases, batches, pauses, weight updates, checkpoints, evals.",
    (
        ATTEMPT,
        _c("step", I64, "the step being assembled or trained (start-up: the step it starts from)"),
        _c("time", F64, "wall clock at the start of the event (unix s)"),
        _c("event", STR, "the event (see docs/records.md for the list)"),
        _c("duration_s", F64, "seconds it lasted, for phases; null for point events"),
        _c("detail", STR, "JSON object with the event's facts (servers, counts, group, ...)", 65_536),
    ),
)

TRAINER_SPANS = Table(
    "trainer_spans",
    1,
    "step",
    "Hierarchical spans of every trainer rank: steps, minibatches, micro-batches, weight sync, checkpoints.",
    (
        ATTEMPT,
        STEP,
        _c("rank", I32, "the trainer rank"),
        _c("node", STR, "the rank's host name"),
        _c("name", STR, "the span's path, e.g. train_step/minibatch/microbatch/forward"),
        _c("parent", STR, "the parent span's path, or empty at the top"),
        _c("depth", I32, "0 at the top"),
        _c(
            "started_at",
            F64,
            "wall clock (unix s); CUDA spans are timed with events and placed on this clock",
        ),
        _c("ended_at", F64, "wall clock (unix s)"),
        _c("microbatch", I32, "the micro-batch, -1 if none"),
        _c("minibatch", I32, "the minibatch (optimizer update), -1 if none"),
        _c("server", STR, "weight_sync/server spans: the server's URL"),
    ),
)

ENVIRONMENTS = Table(
    "environments",
    1,
    "attempt",
    "The environments and evals of the run, once per attempt: what their rewards and tags mean.",
    (
        ATTEMPT,
        _c("role", STR, "`train` or `eval`"),
        _c("name", STR, "the config entry name (an eval: the eval's name)"),
        _c("class_name", STR, "the environment's class"),
        _c("multi_turn", BOOL, "whether episodes have several turns"),
        _c("dataset_size", I64, "prompts loaded"),
        _c("max_turns", I32, "the environment's turn limit, -1 if none"),
        _c("reward_min", F64, "the lowest reward it gives, where declared"),
        _c("reward_max", F64, "the highest reward it gives, where declared"),
        _c("metrics_ranges", STR, "JSON: metric -> {min, max, invert}"),
        _c("tags_options", STR, "JSON: tag -> the values it takes"),
    ),
)

SETUP = Table(
    "setup",
    2,
    "attempt",
    "Hardware and software of every process of the run, once per attempt.",
    (
        ATTEMPT,
        _c("role", STR, "driver, trainer:<rank>, vllm:<url>, or vllm-teacher:<url> / vllm-ref:<url>"),
        _c("node", STR, "host name"),
        _c("node_id", STR, "Ray node id of the process's node (several may share a host); empty outside Ray"),
        _c("cpu_model", STR, "CPU model name"),
        _c("cpu_cores", I32, "logical CPU cores of the node"),
        _c("cpu_physical_cores", I32, "physical CPU cores of the node"),
        _c("memory_gb", F64, "memory of the node (GiB)"),
        _c("gpus", STR, "JSON list of {index, name, memory_gb}"),
        _c("gpu_driver", STR, "NVIDIA driver version, or empty"),
        _c("cuda_version", STR, "CUDA version torch was built with, or empty"),
        _c("python", STR, "Python version"),
        _c("platform", STR, "OS and architecture"),
        _c("versions", STR_MAP, "package -> version (torch, vllm, transformers, ray, telescope-*)"),
        _c("git_commit", STR, "commit of the working tree (with -dirty when it has changes), or empty"),
    ),
)

MODEL = Table(
    "model",
    1,
    "attempt",
    "The trained model's architecture, once per attempt (from trainer rank 0).",
    (
        ATTEMPT,
        _c("model", STR, "the config's model (hub id or path)"),
        _c("parameters", I64, "parameters (this rank's full model)"),
        _c("trainable_parameters", I64, "parameters with gradients"),
        _c("dtype", STR, "dtype of the parameters"),
        _c("num_layers", I32, "repeated blocks (the longest ModuleList)"),
        _c("layer_types", STR, "JSON: module class -> count"),
        _c("architecture", STR, "the module tree as printed by torch", 20_000),
    ),
)

INFRA = Table(
    "infra",
    2,
    "time",
    "Infrastructure samples every few seconds: CPU, memory, GPUs, processes and vLLM's own metrics.",
    (
        _c("time", F64, "wall clock of the sample (unix s)"),
        ATTEMPT,
        _c("node", STR, "host name"),
        _c("node_id", STR, "Ray node id of the sampled node (several may share a host); empty outside Ray"),
        _c("source", STR, "system, process, gpu or vllm"),
        _c("target", STR, "process: its role; gpu: its index; vllm: the server's URL; system: empty"),
        _c("metric", STR, "the metric, unit in the name (_gb, _percent, _s, _total, _mean)"),
        _c("value", F64, "its value"),
    ),
)

TABLES: dict[str, Table] = {
    t.name: t
    for t in (
        SAMPLES,
        TOKENS,
        EVAL_SAMPLES,
        TURNS,
        TOOL_CALLS,
        ROLLOUT_EVENTS,
        ORCHESTRATOR_EVENTS,
        TRAINER_SPANS,
        ENVIRONMENTS,
        SETUP,
        MODEL,
        INFRA,
    )
}
"""Every table of the record, by name."""


def table(name: str) -> Table:
    """The table called ``name``; an unknown name is an error listing the known ones."""
    try:
        return TABLES[name]
    except KeyError:
        raise KeyError(f"unknown record table {name!r}; the tables are: {', '.join(TABLES)}") from None
