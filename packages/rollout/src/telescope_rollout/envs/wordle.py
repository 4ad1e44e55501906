"""wordle: guess a secret five-letter word in six tries (multi-turn, self-contained).

No textarena dependency: the game and a small word list (``data/wordle_words.txt``) live here.
Any five-letter alphabetic guess is accepted (the list is too small to reject real words).
Feedback per letter: G right place, Y elsewhere in the word, X absent (duplicates counted the
standard way). One invalid move (no ``<guess>``, wrong length, repeated guess) is forgiven; the
second ends the game.

Reward (max 2.2): ``_reward_correct`` (solved), ``_reward_partial`` (0.2·G + 0.1·Y of the last
feedback when not solved), ``_reward_length`` (solved / guesses used), ``format_reward``
(weight 0.2; per message 0.4 for one guess tag, 0.2 five letters, 0.2 nothing after the tag,
0.2 at most 200 characters outside ``<think>``).
"""

from __future__ import annotations

import random
import re
from importlib import resources
from typing import Any, ClassVar

from telescope_rollout._types import Message, RewardResult, RolloutState, Sample
from telescope_rollout.envs._env import MultiTurnEnvironment, unit_ranges
from telescope_rollout.envs._rubric import Rubric
from telescope_rollout.parsers import strip_eos, strip_think_tags

_GUESS = re.compile(r"<guess>\s*\[?\s*([^<>\[\]]{0,40}?)\s*\]?\s*</guess>", re.IGNORECASE)
SYSTEM_PROMPT = (
    "You are playing Wordle. Find the secret five-letter English word in at most 6 guesses. Think briefly, "
    "then give exactly one guess as <guess>[word]</guess>. After each guess you get feedback per letter: "
    "G = right letter in the right place, Y = in the word but elsewhere, X = not in the word."
)


def word_list() -> list[str]:
    """The packaged five-letter words, lower case, sorted."""
    text = resources.files("telescope_rollout.envs").joinpath("data", "wordle_words.txt").read_text("utf-8")
    return sorted({w.strip().lower() for w in text.split() if len(w.strip()) == 5 and w.strip().isalpha()})


def feedback(guess: str, secret: str) -> str:
    """Per-letter G/Y/X for ``guess`` against ``secret`` (both five lowercase letters)."""
    out = ["X"] * 5
    left: dict[str, int] = {}
    for i, (g, s) in enumerate(zip(guess, secret, strict=True)):
        if g == s:
            out[i] = "G"
        else:
            left[s] = left.get(s, 0) + 1
    for i, g in enumerate(guess):
        if out[i] != "G" and left.get(g, 0) > 0:
            out[i] = "Y"
            left[g] -= 1
    return "".join(out)


def parse_guess(text: str) -> str | None:
    """The last guess in ``text`` (outside think tags), lower case, or None."""
    found = _GUESS.findall(strip_think_tags(text)[-5_000:])
    return found[-1].strip().lower() if found else None


class WordleEnv(MultiTurnEnvironment):
    """Kwargs: ``num_samples`` (2000 secret words drawn with ``seed`` 0), ``max_turns`` (6)."""

    system_prompt = SYSTEM_PROMPT
    max_turns = 6
    num_samples: int = 2000
    seed: int = 0
    reward_min = 0.0
    reward_max = 2.2

    metrics_ranges: ClassVar[dict[str, dict[str, Any]]] = unit_ranges(
        "_reward_correct", "_reward_partial", "_reward_length", "format_reward"
    )

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.rubric = Rubric()
        self.rubric.add_reward(self._reward_correct, range_min=0.0, range_max=1.0)
        self.rubric.add_reward(self._reward_partial, range_min=0.0, range_max=1.0)
        self.rubric.add_reward(self._reward_length, range_min=0.0, range_max=1.0)
        self.rubric.add_reward(self.format_reward, 0.2, range_min=0.0, range_max=1.0)

    def load_dataset(self, num_samples: int | None = -1, **kwargs: Any) -> list[Sample]:
        words = word_list()
        rng = random.Random(self.seed)
        n = self.num_samples if num_samples is None or num_samples < 0 else num_samples
        prompt = "Make your first guess."
        secrets = [rng.choice(words) for _ in range(n)]
        return self._set_samples([Sample(prompt, w, {"secret_word": w}) for w in secrets], -1)

    def create_initial_state(self, sample: Sample) -> RolloutState:
        state = super().create_initial_state(sample)
        state.custom.update(guesses=[], feedback=[], invalid=0, solved=False, game_over=False)
        return state

    def env_response(self, messages: list[Message], state: RolloutState) -> list[Message]:
        g = state.custom
        text = strip_eos(str(messages[-1].get("content") or ""), self.eos_token) if messages else ""
        guess = parse_guess(text)
        problem = _invalid_move(guess, g["guesses"])
        if guess is None or problem is not None:
            g["invalid"] += 1
            if g["invalid"] >= 2:
                g["game_over"] = True
                return [_feedback(f"Invalid move: {problem} Game over.")]
            return [_feedback(f"Invalid move: {problem} Try again.")]
        fb = feedback(guess, state.sample.answer)
        g["guesses"].append(guess)
        g["feedback"].append(fb)
        if fb == "GGGGG":
            g["solved"] = g["game_over"] = True
            return [_feedback(f"{' '.join(guess.upper())}\n{' '.join(fb)}\nSolved!")]
        left = self.max_turns - len(g["guesses"])
        if left <= 0:
            g["game_over"] = True
        board = "\n".join(
            f"{' '.join(w.upper())}\n{' '.join(f)}" for w, f in zip(g["guesses"], g["feedback"], strict=True)
        )
        return [_feedback(f"{board}\nYou have {left} guesses left.")]

    def is_done(self, state: RolloutState) -> tuple[bool, str | None]:
        if state.custom.get("game_over"):
            return True, "game_over"
        return super().is_done(state)

    def _reward_correct(self, state: RolloutState) -> tuple[float, str]:
        return float(state.custom.get("solved", False)), state.sample.answer

    def _reward_partial(self, state: RolloutState) -> float:
        fbs: list[str] = state.custom.get("feedback") or []
        if state.custom.get("solved") or not fbs:
            return 0.0
        return 0.2 * fbs[-1].count("G") + 0.1 * fbs[-1].count("Y")

    def _reward_length(self, state: RolloutState) -> float:
        n = len(state.custom.get("guesses") or [])
        return 1.0 / n if state.custom.get("solved") and n else 0.0

    def format_reward(self, state: RolloutState) -> float:
        msgs = [str(m.get("content") or "") for step in state.trajectory for m in step.completion]
        if not msgs:
            return 0.0
        return sum(_format_one(strip_eos(m, self.eos_token)) for m in msgs) / len(msgs)

    async def compute_reward(self, state: RolloutState, eos_token: str = "") -> RewardResult:
        r = await self.rubric.score(state=state, eos_token=eos_token or self.eos_token)
        r.sample_metrics["num_guesses"] = float(len(state.custom.get("guesses") or []))
        return r


def _invalid_move(guess: str | None, guessed: list[str]) -> str | None:
    """What is wrong with ``guess`` (None: a valid new five-letter guess)."""
    if guess is None:
        return "No guess found. Write your guess as <guess>[word]</guess>."
    if len(guess) != 5 or not guess.isascii() or not guess.isalpha():
        return f"{guess[:20]!r} is not a five-letter word."
    if guess in guessed:
        return f"You already guessed {guess!r}."
    return None


def _feedback(text: str) -> Message:
    return {"role": "user", "content": text, "turn_type": "feedback"}


def _format_one(text: str) -> float:
    visible = strip_think_tags(text)
    tags = _GUESS.findall(visible)
    score = 0.0
    if len(tags) == 1:
        score += 0.4
        if len(tags[0].strip()) == 5 and tags[0].strip().isalpha():
            score += 0.2
        if visible.rstrip().lower().endswith("</guess>"):
            score += 0.2
    if len(visible) <= 200:
        score += 0.2
    return score
