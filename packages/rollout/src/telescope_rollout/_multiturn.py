"""Exact-token multi-turn sequences with a loss mask (spec §11, "interleaved").

Turn 1 renders the messages to text and tokenizes it. Every later prompt is built from ids:
``previous prompt + the model's own completion ids (never re-tokenized) + the template's
end-of-assistant suffix (minus what the model already generated) + the env messages' ids``.
The suffix and the env-message framing are derived once by rendering a dummy conversation and
slicing around a marker, so any template that renders messages independently works.

The training sequence is the turn-1 prompt followed by a completion that interleaves model tokens
(mask 1, their logprobs) and template/env tokens (mask 0, logprob 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import structlog

from telescope_rollout._template import TemplateError
from telescope_rollout._tokens import Tokenizer
from telescope_rollout._types import Message

log = structlog.get_logger()
_MARKER = "\u2063TELESCOPE_ASSISTANT_MARKER\u2063"
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

    def _render(self, messages: list[Message], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **self.kwargs
        )

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
    completion_ids: list[int] = field(default_factory=list)
    completion_mask: list[int] = field(default_factory=list)
    completion_logprobs: list[float] = field(default_factory=list)

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
        t = self.trajectory
        model_turn = t.completion_ids[_last_model_start(t.completion_mask) :]
        t.add_context_tokens(self.tt.suffix_after(model_turn))
        t.add_context_tokens(self.tt.env_ids(env_messages))
        self.messages.extend(env_messages)
        return t.next_prompt_ids

    def check_prefix(self) -> bool:
        """Whether re-rendering the messages gives the same ids (logs a warning when not)."""
        expected = self.tt.prompt_ids(self.messages)
        ok = expected == self.trajectory.next_prompt_ids
        if not ok:
            log.warning(
                "multiturn_prefix_mismatch",
                expected_len=len(expected),
                got_len=len(self.trajectory.next_prompt_ids),
            )
        return ok


def _last_model_start(mask: list[int]) -> int:
    i = len(mask)
    while i > 0 and mask[i - 1] == 1:
        i -= 1
    return i
