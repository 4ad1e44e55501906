"""What a user did wrong, in words: ``Problem`` (one mistake) and ``ConfigError`` (all of them).

Every user mistake in a config — a bad file, a bad value, a bad flag, a violated cross-field
rule — becomes one ``Problem`` that names the field, the value given, the rule it breaks and
how to fix it. ``load_config`` collects them all and raises one ``ConfigError``, so a user
fixes a file in one pass instead of one error per run.
"""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic_core import PydanticCustomError

__all__ = ["MISSING", "ConfigError", "Problem", "did_you_mean", "rule_error"]


class _Missing:
    """The value of a key that was not given at all."""

    def __repr__(self) -> str:
        return "<not set>"


MISSING = _Missing()

_repr = reprlib.Repr()
_repr.maxstring = 80
_repr.maxother = 80
_repr.maxlist = 8
_repr.maxdict = 6
_repr.maxlevel = 3


@dataclass(frozen=True)
class Problem:
    """One mistake: which ``field``, what ``value`` was given, which ``rule`` it breaks, the ``fix``.

    ``source`` says where the value came from: a file path, a command-line flag such as
    ``--learning-rate``, or ``defaults``.
    """

    field: str
    value: object
    rule: str
    fix: str
    source: str

    def format(self) -> str:
        """A short indented block: ``field = value  (source)``, then the rule and the fix."""
        value = self.value if self.value is MISSING else _repr.repr(self.value)
        return f"{self.field} = {value}  (from {self.source})\n    rule: {self.rule}\n    fix:  {self.fix}"


class ConfigError(Exception):
    """A config that cannot be used; ``problems`` lists every mistake found, ``str()`` reports them."""

    def __init__(self, problems: Sequence[Problem], source: str = "the configuration") -> None:
        super().__init__(list(problems), source)
        self.problems: list[Problem] = list(problems)
        self.source = source

    def __str__(self) -> str:
        n = len(self.problems)
        head = f"{n} problem{'s' if n != 1 else ''} in {self.source}:"
        blocks = [f"  {i}. " + p.format().replace("\n", "\n   ") for i, p in enumerate(self.problems, 1)]
        return "\n".join([head, *blocks])


def did_you_mean(word: str, choices: Sequence[str]) -> str | None:
    """``"did you mean 'x'?"`` for the closest of ``choices`` (difflib), or None when nothing is close."""
    norm = word.strip().lower().replace("-", "_")
    exact = [c for c in choices if c.lower() == norm]
    close = exact or difflib.get_close_matches(norm, list(choices), n=3, cutoff=0.6)
    if not close:
        return None
    return "did you mean " + " or ".join(repr(c) for c in close) + "?"


def rule_error(rule: str, fix: str) -> PydanticCustomError:
    """A validation error that carries our own rule and fix text (read back by ``_load``)."""
    return PydanticCustomError("telescope_rule", "{rule}", {"rule": rule, "fix": fix})
