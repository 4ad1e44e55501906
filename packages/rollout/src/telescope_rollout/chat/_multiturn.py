"""Exact-token multi-turn sequences with a loss mask (docs/rollout.md, "Multi-turn tokens").

Turn 1 renders the messages to text and tokenizes it. Every later prompt is built from ids:
``previous prompt + the model's own completion ids (never re-tokenized) + the template's
end-of-assistant suffix (minus what the model already generated) + the env messages' ids``.
The suffix and the env-message framing are derived once by rendering a dummy conversation and
slicing around a marker, so any template that renders messages independently works.

The training sequence is the turn-1 prompt followed by a completion that interleaves model tokens
(mask 1, their logprobs) and template/env tokens (mask 0, logprob 0).

Where the ids differ from re-rendering the whole conversation (by design: the ids are what the
model actually saw and produced, so they are the right thing to train on):

* Reasoning templates (Qwen3 style) drop the ``<think>...</think>`` block of assistant turns
  that come before the last user query when the conversation is re-rendered. Our ids keep the
  model's reasoning tokens of every turn (mask 1).
* With ``enable_thinking=False`` such templates end the generation prompt with an empty think
  block; it stays in our ids (mask 0) before each model turn, while a re-rendering shows earlier
  assistant turns without it.
* The model's tokens are never re-tokenized, so a non-canonical tokenization the model sampled
  (e.g. one token per character) stays as sampled; the decoded text is still the same.

:meth:`MultiTurnTokens.prefix_status` tells these apart from a real mismatch.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import structlog

from telescope_rollout._types import Message
from telescope_rollout.chat._template import TemplateError
from telescope_rollout.chat._tokens import Tokenizer

log = structlog.get_logger()
_MARKER = "\u2063TELESCOPE_ASSISTANT_MARKER\u2063"
_THINK_BLOCK = re.compile(r"<think>.*?</think>\s*", re.S)
_BASE: list[Message] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "I am a user."},
]


def _overlap(completion: list[int], suffix: list[int]) -> int:
    """The largest k with ``completion[-k:] == suffix[:k]``."""
    for k in range(min(len(completion), len(suffix)), 0, -1):
        if completion[-k:] == suffix[:k]:
            return k
    return 0


class TurnTokenizer:
    """Turns a conversation into ids turn by turn, reusing the model's tokens exactly."""

    def __init__(self, tokenizer: Tokenizer, chat_template_kwargs: dict[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_template_kwargs or {})
        with_assistant = self._render([*_BASE, {"role": "assistant", "content": _MARKER}], False)
        pos = with_assistant.rfind(_MARKER)
        if pos < 0:
            raise TemplateError(
                "the chat template drops assistant content; multi-turn token reuse is impossible"
            )
        self.suffix_text = with_assistant[pos + len(_MARKER) :]
        self.suffix_ids = tokenizer.encode(self.suffix_text)

    def for_kwargs(self, extra: dict[str, Any] | None) -> TurnTokenizer:
        """This tokenizer with ``extra`` template variables merged in (e.g. an environment's
        :meth:`~telescope_rollout.Environment.template_kwargs`); cached, ``self`` when empty."""
        if not extra:
            return self
        key = json.dumps(extra, sort_keys=True, default=str)
        cache = self.__dict__.setdefault("_derived", {})
        if key not in cache:
            cache[key] = TurnTokenizer(self.tokenizer, {**self.kwargs, **extra})
        return cache[key]

    def _render(self, messages: list[Message], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **self.kwargs
        )

    def prompt_text(self, messages: list[Message]) -> str:
        """Text of the first prompt: the rendered messages plus the generation prompt."""
        return self._render(messages, True)

    def prompt_ids(self, messages: list[Message]) -> list[int]:
        """Ids of the first prompt: the rendered messages plus the generation prompt."""
        return self.tokenizer.encode(self._render(messages, True))

    def suffix_after(self, completion_ids: list[int]) -> list[int]:
        """Template tokens closing the assistant turn that the model did not generate itself."""
        return self.suffix_ids[_overlap(completion_ids, self.suffix_ids) :]

    def env_ids(self, env_messages: list[Message]) -> list[int]:
        """Ids of env messages framed as the template frames them, ending with the generation prompt."""
        full = self._render([*_BASE, {"role": "assistant", "content": _MARKER}, *env_messages], True)
        pos = full.rfind(_MARKER)
        tail = full[pos + len(_MARKER) :]
        if pos < 0 or not tail.startswith(self.suffix_text):
            raise TemplateError(
                "cannot frame env messages: the template renders an assistant turn differently"
            )
        return self.tokenizer.encode(tail[len(self.suffix_text) :])


@dataclass
class TokenTrajectory:
    """Prompt ids of turn 1 and the interleaved completion with its mask and logprobs."""

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list[int])
    completion_mask: list[int] = field(default_factory=list[int])
    completion_logprobs: list[float] = field(default_factory=list[float])

    @property
    def next_prompt_ids(self) -> list[int]:
        """What to send to the server for the next turn."""
        return [*self.prompt_ids, *self.completion_ids]

    def add_model_tokens(self, ids: list[int], logprobs: list[float] | None = None) -> None:
        if logprobs is not None and len(logprobs) != len(ids):
            raise ValueError(f"{len(ids)} ids but {len(logprobs)} logprobs")
        self.completion_ids.extend(ids)
        self.completion_mask.extend([1] * len(ids))
        self.completion_logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))

    def add_context_tokens(self, ids: list[int]) -> None:
        self.completion_ids.extend(ids)
        self.completion_mask.extend([0] * len(ids))
        self.completion_logprobs.extend([0.0] * len(ids))


class MultiTurnTokens:
    """The rollout loop's view: start, add a model turn, add env messages, read the next prompt."""

    def __init__(self, turn_tokenizer: TurnTokenizer, messages: list[Message]):
        self.tt = turn_tokenizer
        self.messages = list(messages)
        self.trajectory = TokenTrajectory(prompt_ids=turn_tokenizer.prompt_ids(messages))

    def add_model_turn(
        self, completion_ids: list[int], logprobs: list[float] | None = None, text: str = ""
    ) -> None:
        self.trajectory.add_model_tokens(list(completion_ids), logprobs)
        self.messages.append({"role": "assistant", "content": text})

    def add_env_turn(self, env_messages: list[Message]) -> list[int]:
        """Close the assistant turn, append the env messages; returns the next prompt ids."""
        return self.add_context(self.env_turn_ids(env_messages), env_messages)

    def env_turn_ids(self, env_messages: list[Message]) -> list[int]:
        """The ids :meth:`add_env_turn` appends for ``env_messages`` (the rest of the template's
        end-of-assistant suffix, then the messages' framing), appending nothing: a caller can check
        the room left first."""
        t = self.trajectory
        model_turn = t.completion_ids[_last_model_start(t.completion_mask) :]
        return [*self.tt.suffix_after(model_turn), *self.tt.env_ids(env_messages)]

    def add_context(self, ids: list[int], env_messages: list[Message]) -> list[int]:
        """Append ``ids`` (from :meth:`env_turn_ids` of ``env_messages``) as context, mask 0;
        returns the next prompt ids."""
        self.trajectory.add_context_tokens(ids)
        self.messages.extend(env_messages)
        return self.trajectory.next_prompt_ids

    def prefix_status(self) -> str:
        """How the next prompt compares with re-rendering ``self.messages`` with a generation prompt.

        ``"exact"``: the same ids. ``"same_text"``: the same text, but the model sampled a
        non-canonical tokenization (kept as sampled). ``"reasoning_dropped"``: the same text once
        ``<think>`` blocks are removed, i.e. the template drops earlier turns' reasoning (see the
        module docstring). ``"mismatch"``: anything else (a template that renders messages
        differently in context, or a bug).
        """
        expected = self.tt.prompt_ids(self.messages)
        ours = self.trajectory.next_prompt_ids
        if expected == ours:
            return "exact"
        decode = self.tt.tokenizer.decode
        ours_text, expected_text = decode(ours), decode(expected)
        if ours_text == expected_text:
            return "same_text"
        if _THINK_BLOCK.sub("", ours_text) == _THINK_BLOCK.sub("", expected_text):
            return "reasoning_dropped"
        return "mismatch"

    def check_prefix(self) -> bool:
        """False (and a warning) only when :meth:`prefix_status` is ``"mismatch"``."""
        status = self.prefix_status()
        if status == "mismatch":
            log.warning(
                "multiturn_prefix_mismatch",
                expected_len=len(self.tt.prompt_ids(self.messages)),
                got_len=len(self.trajectory.next_prompt_ids),
            )
        return status != "mismatch"


def _last_model_start(mask: list[int]) -> int:
    i = len(mask)
    while i > 0 and mask[i - 1] == 1:
        i -= 1
    return i
