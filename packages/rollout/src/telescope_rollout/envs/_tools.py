"""ToolEnvironment: multi-turn tasks where the model calls Python functions.

Tools are plain typed functions (sync or async) with docstrings. Their schemas go into the
system prompt; the model's calls are parsed (:mod:`._toolcalls`), executed one after another, and
their results or errors go back as one ``tool_result`` message. No malformed call ever raises out
of the environment. Per-rollout records live in ``state.custom``, never on the environment, so
concurrent rollouts do not share state.

Each call leaves a record in ``state.custom["tool_calls"]`` (JSON-able; see
:meth:`ToolEnvironment.env_response`). A tool that runs a program in a sandbox can return the
sandbox's result (an object with an integer ``exit_code``, e.g. what
:class:`~telescope_rollout.envs.SandboxLike` ``.run`` returns, or a dict with that key): its exit
code is recorded, and the sandbox is named by the result's ``sandbox_id`` (or ``sandbox``) text,
else the environment's ``provider`` setting, else the class of its ``sandbox``. The model still
sees the result as text, as before.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from telescope_rollout._types import Message, RolloutState, Sample
from telescope_rollout.envs._env import MultiTurnEnvironment
from telescope_rollout.envs._toolcalls import MAX_CALLS, ToolCall, parse_tool_calls, strip_tool_call_blocks
from telescope_rollout.envs._toolschema import coerce_arguments, func_to_tool_schema

MAX_RECORD_CHARS = 2000
"""Arguments and raw call text are cut to this many characters in the tool-call records."""

_XML_EXAMPLE = '<tool_call>\n{"name": "tool_name", "arguments": {"arg": "value"}}\n</tool_call>'
_FUNCTION_EXAMPLE = 'tool_name(arg="value")'


@dataclass
class _ToolRun:
    """What one call did: success and the text for the model, plus the facts the record keeps."""

    ok: bool
    text: str
    exit_code: int | None = None
    sandbox: str = ""
    truncated: bool = False
    """The result text was cut to ``max_result_chars``."""


def default_error_formatter(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def format_tool_section(schemas: list[dict[str, Any]], tool_call_format: str = "xml") -> str:
    """The "# Available Tools" and "# Tool Call Format" sections of the system prompt."""
    lines = ["# Available Tools", ""]
    for s in schemas:
        fn = s["function"]
        lines.append(f"## {fn['name']}")
        if fn["description"]:
            lines.append(fn["description"])
        params = fn["parameters"]
        for pname, prop in params["properties"].items():
            req = " (required)" if pname in params["required"] else ""
            desc = f": {prop['description']}" if prop.get("description") else ""
            lines.append(f"- {pname} ({prop.get('type', 'string')}){req}{desc}")
        lines.append("")
    example = _FUNCTION_EXAMPLE if tool_call_format == "function" else _XML_EXAMPLE
    lines += [
        "# Tool Call Format",
        "",
        "To call a tool, write:",
        example,
        "",
        "Answer without a tool call when done.",
    ]
    return "\n".join(lines)


class ToolEnvironment(MultiTurnEnvironment):
    """Multi-turn environment whose env turns execute the model's tool calls.

    Subclasses implement ``load_dataset`` and ``compute_reward(state, eos_token)``; add
    :meth:`get_tool_metrics` to the reward's metrics to record tool use.
    """

    kind: ClassVar[str] = "tool"
    max_result_chars: int = 8_000
    tool_timeout_s: float = 60.0
    tool_message_role: str = "user"

    def __init__(
        self,
        tools: list[Callable[..., Any]] | None = None,
        *,
        max_turns: int = 10,
        tool_call_format: str = "xml",
        include_tool_schemas_in_prompt: bool | None = None,
        error_formatter: Callable[[BaseException], str] | None = None,
        system_prompt: str | None = None,
        tools_in_template: bool = False,
        **kwargs: Any,
    ):
        super().__init__(max_turns=max_turns, system_prompt=system_prompt, **kwargs)
        self.tools = list(tools or [])
        self.tool_map = {t.__name__: t for t in self.tools}
        self.tool_schemas = [func_to_tool_schema(t) for t in self.tools]
        self._schema_by_name = {s["function"]["name"]: s for s in self.tool_schemas}
        self.tool_call_format = tool_call_format if tool_call_format in ("xml", "function") else "xml"
        self.tools_in_template = bool(tools_in_template)
        # Default: the text section unless the template shows the tools (``None`` = choose).
        self.include_tool_schemas_in_prompt = (
            not self.tools_in_template
            if include_tool_schemas_in_prompt is None
            else include_tool_schemas_in_prompt
        )
        self.error_formatter = error_formatter or default_error_formatter

    def template_kwargs(self) -> dict[str, Any]:
        """``{"tools": schemas}`` when ``tools_in_template``, else nothing."""
        return {"tools": self.tool_schemas} if self.tools_in_template and self.tools else {}

    def get_initial_prompt(self, sample: Sample, tokenizer: Any = None) -> list[Message]:
        messages = super().get_initial_prompt(sample, tokenizer)
        template = getattr(tokenizer, "template", None)
        if self.tools_in_template and template is not None and not template.supports_tools:
            raise ValueError(
                f"{self.name}: tools_in_template=True but the chat template has no `tools` variable;"
                " use a model/template with native tool calling or set tools_in_template: false"
            )
        if not self.include_tool_schemas_in_prompt or not self.tools:
            return messages
        section = format_tool_section(self.tool_schemas, self.tool_call_format)
        if messages and messages[0].get("role") == "system":
            return [{**messages[0], "content": f"{messages[0]['content']}\n\n{section}"}, *messages[1:]]
        return [{"role": "system", "content": section}, *messages]

    def parse_tool_calls(self, text: str) -> list[ToolCall]:
        return parse_tool_calls(text, self.tool_call_format, list(self.tool_map))

    def is_final_answer(self, completion: str, state: RolloutState) -> bool:
        """Default: the turn has no tool call."""
        return not self.parse_tool_calls(completion)

    async def execute_tool(self, call: ToolCall, state: RolloutState | None = None) -> tuple[bool, str]:
        """Run one call; returns (success, result or error text). Never raises.

        A tool that declares a ``state`` parameter receives the rollout's state.
        """
        run = await self._run_tool(call, state)
        return run.ok, run.text

    async def _run_tool(self, call: ToolCall, state: RolloutState | None) -> _ToolRun:
        """:meth:`execute_tool` with the facts of the run (exit code, sandbox, truncation)."""
        if call.error:
            return _ToolRun(False, call.error)
        func = self.tool_map.get(call.name)
        if func is None:
            available = ", ".join(self.tool_map) or "none"
            return _ToolRun(False, f"unknown tool {call.name[:100]!r}; available tools: {available}")
        schema = self._schema_by_name[call.name]
        try:
            args = _name_positional(call.arguments, list(schema["function"]["parameters"]["properties"]))
            args = coerce_arguments(schema, args)
        except ValueError as exc:
            return _ToolRun(False, f"argument_error: {exc}")
        if state is not None and "state" in inspect.signature(func).parameters:
            args["state"] = state
        try:
            out = func(**args)
            if inspect.isawaitable(out):
                async with asyncio.timeout(self.tool_timeout_s):
                    out = await out
        except TypeError as exc:
            return _ToolRun(False, f"argument_error: {exc}")
        except TimeoutError:
            return _ToolRun(False, f"TimeoutError: tool did not finish within {self.tool_timeout_s} s")
        except Exception as exc:
            return _ToolRun(False, self.error_formatter(exc))
        text = out if isinstance(out, str) else _to_text(out)
        truncated = len(text) > self.max_result_chars
        if truncated:
            text = text[: self.max_result_chars] + f"... [truncated, {len(text)} characters]"
        exit_code = _exit_code(out)
        sandbox = self._sandbox_label(out) if exit_code is not None else ""
        return _ToolRun(True, text, exit_code, sandbox, truncated)

    async def _tool_run(self, call: ToolCall, state: RolloutState) -> _ToolRun:
        """The run of one call; a subclass's own :meth:`execute_tool` is honoured (its facts unknown)."""
        if type(self).execute_tool is not ToolEnvironment.execute_tool:
            ok, text = await self.execute_tool(call, state)
            return _ToolRun(ok, text)
        return await self._run_tool(call, state)

    def _sandbox_label(self, out: Any) -> str:
        """The sandbox a program ran in: the result's ``sandbox_id``/``sandbox`` text, else the
        environment's ``provider`` setting, else the class of its ``sandbox``, else ""."""
        for attr in ("sandbox_id", "sandbox"):
            value = _field(out, attr)
            if isinstance(value, str) and value:
                return value
        provider = getattr(self, "provider", None)
        if isinstance(provider, str) and provider:
            return provider
        sandbox = getattr(self, "sandbox", None)
        return "" if sandbox is None else type(sandbox).__name__

    def completion_message(self, text: str) -> Message:
        """The assistant message for a completion ``text``.

        Native mode: the text outside ``<tool_call>`` blocks as ``content`` and the well-formed
        calls as OpenAI-style ``tool_calls`` (ids ``call_0``, ``call_1``, ... in order), so the
        template renders them its own way. Otherwise (or with no well-formed call) the raw text.
        """
        calls = [c for c in self.parse_tool_calls(text) if not c.error]
        if not self.tools_in_template or not calls or self.tool_call_format != "xml":
            return {"role": "assistant", "content": text}
        return {
            "role": "assistant",
            "content": strip_tool_call_blocks(text),
            "tool_calls": [_openai_call(i, c) for i, c in enumerate(calls)],
        }

    def _calls_of(self, message: Message) -> list[tuple[ToolCall, str]]:
        """The calls of an assistant message with their ids: structured ``tool_calls`` keep their
        ``id``; calls parsed from text are numbered as :meth:`completion_message` numbers them
        (``call_0``, ... over well-formed calls; ``call_invalid_<i>`` for broken ones)."""
        structured: object = message.get("tool_calls")
        if isinstance(structured, list) and structured:
            out: list[tuple[ToolCall, str]] = []
            for i, entry in enumerate(cast(list[object], structured)[:MAX_CALLS]):
                entry_dict = _as_dict(entry)
                given = entry_dict.get("id") if entry_dict is not None else None
                out.append((_structured_call(entry), str(given) if given else f"call_{i}"))
            return out
        calls = self.parse_tool_calls(str(message.get("content") or ""))
        ids: list[str] = []
        good = 0
        for i, call in enumerate(calls):
            ids.append(f"call_invalid_{i}" if call.error else f"call_{good}")
            good += 0 if call.error else 1
        return list(zip(calls, ids, strict=True))

    async def env_response(self, messages: list[Message], state: RolloutState) -> list[Message]:
        """Run the calls of the model's last message, one after another; one reply with every result.

        Each call appends a record to ``state.custom["tool_calls"]``: ``generation_idx`` (the
        model turn, from 0), ``tool_call_idx``, ``tool_name``, ``arguments`` (JSON text) and
        ``raw_text`` (both cut to :data:`MAX_RECORD_CHARS`), ``result``, ``success``, ``error``,
        ``start`` (wall clock), ``duration_s``, ``exit_code`` (int or None: see the module
        docstring), ``sandbox`` ("" when none) and ``truncated`` (result, arguments or raw text cut).
        """
        calls_with_ids = self._calls_of(messages[-1]) if messages else []
        calls = [c for c, _ in calls_with_ids]
        if not calls:
            state.custom["_final_answer"] = True
            return []
        tc = state.custom.setdefault("tool_calls", [])
        replies: list[Message] = []  # with tools_in_template: one tool message per call
        lines: list[str] = []  # otherwise: one line per call, all in one message
        for i, call in enumerate(calls):
            start, t0 = time.time(), time.perf_counter()
            run = await self._tool_run(call, state)
            tc.append(_call_record(state.num_turns - 1, len(tc), call, run, start, time.perf_counter() - t0))
            ok, text = run.ok, run.text
            if self.tools_in_template:
                replies.append(
                    {
                        "role": "tool",
                        "tool_call_id": calls_with_ids[i][1],
                        "name": call.name[:100],
                        "content": text if ok else f"Error: {text}",
                        "turn_type": "tool_result",
                    }
                )
                continue
            line = (
                f"[{call.name[:100] or 'tool'}] {text}"
                if ok
                else f"[{call.name[:100] or 'tool'}] Error: {text}"
            )
            lines.append(f"Tool {i + 1}: {line}" if len(calls) > 1 else line)
        if self.tools_in_template:
            return replies
        return [{"role": self.tool_message_role, "content": "\n\n".join(lines), "turn_type": "tool_result"}]

    def is_done(self, state: RolloutState) -> tuple[bool, str | None]:
        if state.custom.get("_final_answer"):
            return True, "final_answer"
        return super().is_done(state)

    @staticmethod
    def get_tool_metrics(state: RolloutState) -> dict[str, float]:
        """Per-sample tool metrics: total_tool_calls, tool_success_count, tool_error_count,
        tool_success_rate, unique_tools_used and ``<tool>_calls``."""
        records = state.custom.get("tool_calls", [])
        ok = sum(1 for r in records if r["success"])
        names = [r["tool_name"] for r in records if r["tool_name"]]
        metrics = {
            "total_tool_calls": float(len(records)),
            "tool_success_count": float(ok),
            "tool_error_count": float(len(records) - ok),
            "tool_success_rate": ok / len(records) if records else 0.0,
            "unique_tools_used": float(len(set(names))),
        }
        for n in set(names):
            metrics[f"{n}_calls"] = float(names.count(n))
        return metrics


def _call_record(
    generation_idx: int, index: int, call: ToolCall, run: _ToolRun, start: float, duration_s: float
) -> dict[str, Any]:
    """The ``state.custom["tool_calls"]`` record of one call (see ``ToolEnvironment.env_response``)."""
    arguments = _to_text(call.arguments)
    cut = len(arguments) > MAX_RECORD_CHARS or len(call.raw) > MAX_RECORD_CHARS
    return {
        "generation_idx": generation_idx,
        "tool_call_idx": index,
        "tool_name": call.name[:100],
        "arguments": arguments[:MAX_RECORD_CHARS],
        "raw_text": call.raw[:MAX_RECORD_CHARS],
        "result": run.text if run.ok else "",
        "success": run.ok,
        "error": None if run.ok else run.text,
        "start": start,
        "duration_s": duration_s,
        "exit_code": run.exit_code,
        "sandbox": run.sandbox,
        "truncated": run.truncated or cut,
    }


def _field(out: Any, name: str) -> Any:
    """Attribute ``name`` of a tool's result object, or its key ``name`` when it is a dict."""
    return cast(dict[str, Any], out).get(name) if isinstance(out, dict) else getattr(out, name, None)


def _as_dict(value: object) -> dict[str, Any] | None:
    return cast(dict[str, Any], value) if isinstance(value, dict) else None


def _exit_code(out: Any) -> int | None:
    """The integer ``exit_code`` of a sandbox's result (a ``RunResultLike`` or a dict), else None."""
    code = _field(out, "exit_code")
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def _openai_call(i: int, call: ToolCall) -> dict[str, Any]:
    function = {"name": call.name, "arguments": call.arguments}
    return {"id": f"call_{i}", "type": "function", "function": function}


def _structured_call(tc: Any) -> ToolCall:
    """A :class:`ToolCall` from an OpenAI-style ``tool_calls`` entry (arguments a dict or JSON text)."""
    entry = _as_dict(tc)
    fn = _as_dict(entry.get("function", tc)) if entry is not None else None
    name: object = fn.get("name") if fn is not None else None
    if fn is None or not isinstance(name, str):
        return ToolCall("", raw=_to_text(tc)[:200], error="a tool call needs a function name")
    args: object = fn.get("arguments") or {}
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            return ToolCall(name, raw=args[:200], error="`arguments` is a string that is not JSON")
    if not isinstance(args, dict):
        return ToolCall(name, raw=_to_text(args)[:200], error="`arguments` must be a JSON object")
    return ToolCall(name, cast(dict[str, Any], args), raw=_to_text(fn)[:2000])


def _name_positional(args: dict[str, Any], names: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in args.items():
        name = key
        if key.isdigit():
            if int(key) >= len(names):
                raise ValueError(f"too many positional arguments (the tool takes {len(names)})")
            name = names[int(key)]
        out[name] = value
    return out


def _to_text(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        return str(value)
