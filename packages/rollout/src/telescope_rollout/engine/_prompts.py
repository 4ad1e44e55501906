"""Prompt preparation and prefetch: draw, format with the chat template, tokenize (docs/rollout.md,
"Prompt prefetch").

Single-turn prompts are rendered by the environment's ``format_prompt`` and tokenized locally,
so the engine knows each prompt's length (``max_tokens`` is shortened to fit ``max_model_len``)
and sends token ids, which come back unchanged for training. Multi-turn environments start from
their initial messages; :class:`TurnTokenizer` tokenizes them.

The prefetcher keeps ``prompt_prefetch_buffer_size`` prompts ready while the dispatcher waits
for lanes. Only prompts handed out count as consumed, so a checkpoint resumes exactly there.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from telescope_rollout._types import Message, Sample
from telescope_rollout.chat._multiturn import TurnTokenizer
from telescope_rollout.engine._sampler import MultiEnvSampler, sample_from
from telescope_rollout.envs._agent import AgentEnvironment
from telescope_rollout.envs._env import Environment, MultiTurnEnvironment, SingleTurnEnvironment


@dataclass
class PreparedPrompt:
    """A drawn sample, ready to send."""

    env_name: str
    index: int
    sample: Sample
    text: str
    ids: list[int]
    messages: list[Message] | None = None
    """The initial messages of a multi-turn episode (None for single-turn)."""


class PromptSource:
    """Draws from the sampler and prepares prompts, optionally ahead of time.

    Without a sampler (``None``) only :meth:`prepare` works: evals render their own samples.
    """

    def __init__(
        self,
        environments: Mapping[str, Environment],
        sampler: MultiEnvSampler | None,
        tokenizer: Any,
        *,
        buffer_size: int = 0,
        chat_template_kwargs: dict[str, Any] | None = None,
    ):
        self.environments = environments
        self.sampler = sampler
        self.tokenizer = tokenizer
        self.buffer_size = buffer_size
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._buffer: deque[PreparedPrompt] = deque()
        self._returned: deque[PreparedPrompt] = deque()
        self._need = asyncio.Event()
        self._turns: TurnTokenizer | None = None

    @property
    def turn_tokenizer(self) -> TurnTokenizer:
        if self._turns is None:
            self._turns = TurnTokenizer(self.tokenizer, self.chat_template_kwargs)
        return self._turns

    def _drawing(self) -> MultiEnvSampler:
        if self.sampler is None:
            raise RuntimeError("this PromptSource has no sampler: only prepare() works")
        return self.sampler

    @property
    def consumed(self) -> int:
        """Sampler draws handed out (prefetched and returned prompts not counted)."""
        return self._drawing().draws - len(self._buffer) - len(self._returned)

    def prepare_next(self) -> PreparedPrompt:
        draw = self._drawing().draw()
        sample = sample_from(self.environments, draw)
        return self.prepare(self.environments[draw.entry], draw.entry, draw.index, sample)

    def prepare(self, env: Environment, env_name: str, index: int, sample: Sample) -> PreparedPrompt:
        """Render one sample through the chat template and tokenize it (also used by evals)."""
        if isinstance(env, MultiTurnEnvironment | AgentEnvironment):
            # an agent's: the conversation it is expected to open with (the checks that prompts fit)
            messages = (
                env.get_initial_prompt(sample)
                if isinstance(env, AgentEnvironment)
                else env.get_initial_prompt(sample, self.tokenizer)
            )
            text = self.turn_tokenizer.for_kwargs(env.template_kwargs()).prompt_text(messages)
            return PreparedPrompt(env_name, index, sample, text, self.tokenizer.encode(text), messages)
        if not isinstance(env, SingleTurnEnvironment):
            raise TypeError(
                f"{env_name}: an environment is a SingleTurnEnvironment, a MultiTurnEnvironment or an "
                "AgentEnvironment"
            )
        kwargs = self.chat_template_kwargs
        text = env.format_prompt(sample.prompt, self.tokenizer, chat_template_kwargs=kwargs)
        return PreparedPrompt(env_name, index, sample, text, self.tokenizer.encode(text))

    def take(self) -> PreparedPrompt:
        """The next prompt: a returned one, a prefetched one, or one prepared now."""
        if self._returned:
            return self._returned.popleft()
        self._need.set()
        if self._buffer:
            return self._buffer.popleft()
        return self.prepare_next()

    def put_back(self, prompt: PreparedPrompt) -> None:
        """Return a prompt that could not be dispatched; it is handed out next."""
        self._returned.appendleft(prompt)

    def reset(self) -> None:
        """Forget prefetched prompts (after the sampler was rewound)."""
        self._buffer.clear()
        self._returned.clear()

    async def prefetch(self) -> None:
        """Keep the buffer full; runs until cancelled."""
        while True:
            while len(self._buffer) < self.buffer_size:
                self._buffer.append(self.prepare_next())
                await asyncio.sleep(0)
            self._need.clear()
            await self._need.wait()
