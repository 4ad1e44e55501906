"""Token-in/token-out for one agent episode: its calls become training sequences of sampled tokens.

An agent sends its whole conversation on every call. The first call's messages are rendered and
tokenized (with the request's ``tools``); the answer's ids are the ids vLLM sampled. A later call
**extends** the episode when its messages are the previous call's plus the assistant message the
gateway returned, followed by new messages (tool results, a user turn), with the same tools: its
prompt is then built from ids (``chat.MultiTurnTokens``: the previous prompt, the sampled ids,
the rest of the template's end-of-turn suffix and the new messages' framing), so however the
agent re-serialises earlier turns, the model sees, and the trainer trains on, exactly what was
sampled. Any other call starts a new **segment** (a training sequence of its own, rendered from
its messages), with the reason:

- ``tools_changed``: the request's tools differ from the segment's;
- ``resent``: the same messages as the previous call (a retry);
- ``assistant_edited@i``: message ``i``, an answer the gateway gave, came back changed;
- ``history_rewritten@i``: message ``i``, one the agent wrote, came back changed or dropped;
- ``history_truncated``: fewer messages than the conversation so far, each unchanged.

A segment is created only when its call is answered (:meth:`EpisodeTokens.commit`), so none is
empty. Comparison is on the canonical form of ``gateway._messages``.

Calls to ``/completions`` (:meth:`EpisodeTokens.plan_completion`) send the prompt itself: token ids
(true token-in) or text. A prompt extends the episode when it starts with everything so far (the
segment's prompt, the sampled ids and the context since, as ids, or decoded for a text prompt);
what follows is context (its text encoded on its own), and a prompt equal to everything so far
continues the answer. Otherwise a new segment begins: ``resent``, ``history_truncated`` (a
prefix of everything so far), ``history_rewritten@<token>`` (the first token that differs) or
``endpoint_changed`` (the episode's previous call was to the other endpoint).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from telescope_rollout._types import Message
from telescope_rollout.chat._multiturn import MultiTurnTokens, TokenTrajectory, TurnTokenizer
from telescope_rollout.gateway._messages import RequestError, tools_key

__all__ = ["CallPlan", "EpisodeTokens", "PromptTokens", "Segment"]


class PromptTokens:
    """The token state of a ``/completions`` segment: a trajectory from raw prompt ids (no
    messages, no template), with :class:`MultiTurnTokens`' interface for what a segment does."""

    def __init__(self, prompt_ids: list[int]) -> None:
        self.trajectory = TokenTrajectory(prompt_ids=list(prompt_ids))
        self.messages: list[Message] = []
        self.last_prompt: list[int] = list(prompt_ids)
        self.last_text: str | None = None
        """The last call's prompt, when it was text."""
        self.added = 0
        """Special tokens the tokenizer put before a text prompt (a BOS), not in the agent's text."""

    def add_context(self, ids: list[int], messages: list[Message]) -> list[int]:
        self.trajectory.add_context_tokens(list(ids))
        return self.trajectory.next_prompt_ids

    def add_model_turn(self, ids: list[int], logprobs: list[float] | None = None, text: str = "") -> None:
        self.trajectory.add_model_tokens(list(ids), logprobs)


@dataclass
class Segment:
    """One training sequence of an episode: its tokens, why it began ("" for the first), how many
    calls it holds and which endpoint made them (``chat`` or ``completions``)."""

    tokens: MultiTurnTokens | PromptTokens
    reason: str
    tools_key: str
    calls: int = 0
    endpoint: str = "chat"


@dataclass
class CallPlan:
    """What one call sends: ``prompt_ids``; for an extension, the ``context_ids`` to append before
    the answer (mask 0) and the new messages (``tail``); for a new segment, its ``tokens`` and
    ``split`` (its reason)."""

    messages: list[Message]
    tools_key: str
    prompt_ids: list[int]
    tail: list[Message] = field(default_factory=list[Message])
    context_ids: list[int] = field(default_factory=list[int])
    tokens: MultiTurnTokens | PromptTokens | None = None
    split: str | None = None
    segment: int = 0
    """The segment (training sequence) of the episode the call belongs to, from 0."""
    context_text: str = ""
    """``/completions``: the text of ``context_ids`` (chat calls have their ``tail`` messages)."""
    prompt_text: str | None = None
    """``/completions``: the prompt as the agent sent it, when text (a retry of it is ``resent``)."""


class EpisodeTokens:
    """The token state of one episode (module docstring): plan a call, then commit its answer."""

    def __init__(self, turn_tokenizer: TurnTokenizer) -> None:
        self.tt = turn_tokenizer
        self.segments: list[Segment] = []
        self._last: list[Message] = []
        """The last answered call's messages."""
        self._expected: list[Message] = []
        """... followed by the assistant message the gateway returned."""

    def plan(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> CallPlan:
        """The prompt of a call with canonical ``messages`` and ``tools``; changes nothing."""
        if messages[-1]["role"] == "assistant":
            raise RequestError(
                "the last message is the assistant's: continuing a partial answer is not supported "
                "(the trained tokens would not be the sampled ones); end with a user or tool message",
                param="messages",
            )
        key = tools_key(tools)
        reason = self._divergence(messages, key) if self.segments else ""
        if reason is None:
            seg = cast(MultiTurnTokens, self.segments[-1].tokens)  # a chat segment (_divergence)
            tail = messages[len(self._expected) :]
            ids = seg.env_turn_ids(tail)
            prompt = [*seg.trajectory.next_prompt_ids, *ids]
            return CallPlan(messages, key, prompt, tail=tail, context_ids=ids, segment=len(self.segments) - 1)
        tokens = MultiTurnTokens(self.tt.for_kwargs({"tools": tools} if tools else None), messages)
        return CallPlan(
            messages,
            key,
            tokens.trajectory.prompt_ids,
            tokens=tokens,
            split=reason,
            segment=len(self.segments),
        )

    def plan_completion(self, prompt: list[int] | str) -> CallPlan:
        """The prompt of a ``/completions`` call (module docstring); changes nothing."""
        tok = self.tt.tokenizer
        if isinstance(prompt, list) and max(prompt) >= tok.vocab_size:
            raise RequestError(
                f"prompt holds token id {max(prompt)}, but this model's tokenizer has {tok.vocab_size} ids",
                param="prompt",
            )
        last = self.segments[-1] if self.segments else None
        if last is None or not isinstance(last.tokens, PromptTokens):
            return self._new_prompt(prompt, "endpoint_changed" if last is not None else "")
        seg = last.tokens
        have = seg.trajectory.next_prompt_ids
        if isinstance(prompt, str):
            if prompt == seg.last_text:
                return self._new_prompt(prompt, "resent")
            have_text = tok.decode(have[seg.added :])  # as the agent wrote it: no added BOS
            if prompt.startswith(have_text):
                context = prompt[len(have_text) :]
                return self._extension([*have, *tok.encode(context)], have, context, prompt)
            return self._new_prompt(prompt, _token_divergence(_encoded(tok, prompt), have, seg.last_prompt))
        if prompt[: len(have)] == have:
            return self._extension(prompt, have, tok.decode(prompt[len(have) :]))
        return self._new_prompt(prompt, _token_divergence(prompt, have, seg.last_prompt))

    def _new_prompt(self, prompt: list[int] | str, reason: str) -> CallPlan:
        """A new segment from ``prompt``: ids as given, or text encoded as vLLM encodes a text prompt
        (with the tokenizer's special tokens, e.g. a BOS)."""
        tok = self.tt.tokenizer
        ids = prompt if isinstance(prompt, list) else _encoded(tok, prompt)
        tokens = PromptTokens(ids)
        if isinstance(prompt, str):
            tokens.added = len(ids) - len(tok.encode(prompt))
            tokens.last_text = prompt
        return CallPlan([], "", list(ids), tokens=tokens, split=reason, segment=len(self.segments))

    def _extension(
        self, prompt_ids: list[int], have: list[int], context_text: str, text: str | None = None
    ) -> CallPlan:
        context = prompt_ids[len(have) :]
        segment = len(self.segments) - 1
        return CallPlan(
            [],
            "",
            list(prompt_ids),
            context_ids=context,
            segment=segment,
            context_text=context_text,
            prompt_text=text,
        )

    def _divergence(self, messages: list[Message], key: str) -> str | None:
        """Why ``messages`` do not extend the episode (None: they do)."""
        if self.segments[-1].endpoint != "chat":
            return "endpoint_changed"
        if key != self.segments[-1].tools_key:
            return "tools_changed"
        if messages == self._last:
            return "resent"
        expected = self._expected
        for i, (got, want) in enumerate(zip(messages, expected, strict=False)):
            if got != want:
                ours = i == len(expected) - 1 and want["role"] == "assistant"
                return f"{'assistant_edited' if ours else 'history_rewritten'}@{i}"
        return "history_truncated" if len(messages) <= len(expected) else None

    def commit(
        self, plan: CallPlan, ids: list[int], logprobs: list[float], text: str, answer: Message
    ) -> Segment:
        """Record the answer to ``plan``'s call: the sampled ``ids`` and ``logprobs`` (mask 1), and
        ``answer``, the assistant message returned (canonical), which the next call must echo.
        Returns the segment the call belongs to."""
        if plan.tokens is not None:
            endpoint = "completions" if isinstance(plan.tokens, PromptTokens) else "chat"
            self.segments.append(Segment(plan.tokens, plan.split or "", plan.tools_key, endpoint=endpoint))
        seg = self.segments[-1]
        if plan.tokens is None:
            seg.tokens.add_context(plan.context_ids, plan.tail)
        if isinstance(seg.tokens, PromptTokens):
            seg.tokens.last_prompt = list(plan.prompt_ids)
            if plan.tokens is None:
                seg.tokens.last_text = plan.prompt_text
        seg.tokens.add_model_turn(ids, logprobs, text)
        seg.calls += 1
        self._last = plan.messages
        self._expected = [*plan.messages, answer]
        return seg


def _encoded(tok: Any, text: str) -> list[int]:
    """``text`` as vLLM's ``/completions`` encodes a text prompt: with the tokenizer's special tokens."""
    return tok.encode(text, add_special_tokens=True)


def _token_divergence(ids: list[int], have: list[int], last_prompt: list[int]) -> str:
    """Why prompt ``ids`` do not extend ``have`` (everything so far): a retry of the last prompt, a
    shorter history, or the first token that differs."""
    if ids == last_prompt:
        return "resent"
    if have[: len(ids)] == ids:
        return "history_truncated"
    first = next(i for i, (a, b) in enumerate(zip(ids, have, strict=False)) if a != b)
    return f"history_rewritten@{first}"
