"""Math answer checking: math-verify when installed (extra ``math``), a plain fallback otherwise.

The fallback normalises common LaTeX noise (``$``, ``\\left``, ``\\text{}``, ``\\dfrac``, degree
signs, thousands separators, ``x =``) and compares exactly or as rational numbers. It is stricter
than math-verify (equal expressions written differently score 0), so a missing math-verify is
warned about once per process (``math_verify_missing``).
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction
from typing import Any

import structlog

from telescope_rollout.parsers import extract_boxed_answer

log = structlog.get_logger()
MAX_PREDICTION_CHARS = 500
_FRAC = re.compile(r"^(-?)\\frac\{([^{}]+)\}\{([^{}]+)\}$")
_SIMPLE_FRAC = re.compile(r"^(-?)\\frac(\d)(\d)$")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")


@functools.cache
def _math_verify() -> Any:
    """The math_verify module, or None (warned about once) when it is not installed."""
    try:
        import math_verify
    except ImportError:
        log.warning(
            "math_verify_missing",
            fix="pip install math-verify (or the extra: pip install 'telescope-rollout[math]')",
            effect="math answers are checked by the plain fallback only, which is stricter: "
            "an equal answer written another way scores 0",
        )
        return None
    return math_verify


def normalize_math_answer(text: str) -> str:
    """A canonical string form of a short math answer (used by the fallback checker)."""
    s = text.strip()
    inner = extract_boxed_answer(s)
    if inner is not None:
        s = inner
    s = s.strip().strip("$").strip()
    s = _TEXT.sub(r"\1", s)
    for old, new in (
        ("\\left", ""),
        ("\\right", ""),
        ("\\!", ""),
        ("\\,", ""),
        ("\\;", ""),
        ("\\dfrac", "\\frac"),
        ("\\tfrac", "\\frac"),
        ("^\\circ", ""),
        ("^{\\circ}", ""),
        ("°", ""),
        ("\\%", ""),
        ("%", ""),
        ("−", "-"),
    ):
        s = s.replace(old, new)
    s = re.sub(r"\s+", "", s)
    s = re.sub(r"^[a-zA-Z]\s*=", "", s)
    s = s.rstrip(".")
    if re.fullmatch(r"-?[0-9]{1,3}(,[0-9]{3})+(\.[0-9]+)?", s):
        s = s.replace(",", "")
    return s


def _as_fraction(s: str) -> Fraction | None:
    m = _FRAC.match(s) or _SIMPLE_FRAC.match(s)
    if m:
        s = f"{m.group(1)}{m.group(2)}/{m.group(3)}"
    if len(s) > 60 or not re.fullmatch(r"-?[0-9]+(\.[0-9]+)?(/-?[0-9]+(\.[0-9]+)?)?", s):
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def fallback_math_equal(prediction: str, ground_truth: str) -> bool:
    """Normalised string equality, or equal rational values."""
    p, g = normalize_math_answer(prediction), normalize_math_answer(ground_truth)
    if not p or not g:
        return False
    if p == g:
        return True
    fp, fg = _as_fraction(p), _as_fraction(g)
    return fp is not None and fg is not None and fp == fg


def braces_balanced(text: str) -> bool:
    """Whether every ``}`` closes an earlier ``{`` and none is left open."""
    depth = 0
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


def verify_math_answer(
    prediction: str | None, ground_truth: str | None, *, use_math_verify: bool = True
) -> bool:
    """Whether ``prediction`` is mathematically the ground truth.

    Empty or over-500-character predictions are wrong, and so are predictions with unbalanced
    braces (math-verify would spend its whole 5 s timeout on ``{{{...``). With math-verify
    installed both sides are parsed as ``\\boxed{...}`` (5 s timeouts); its errors count as wrong
    after :func:`fallback_math_equal` had its say.
    """
    if not prediction or not ground_truth or len(prediction) > MAX_PREDICTION_CHARS:
        return False
    if fallback_math_equal(prediction, ground_truth):
        return True
    mv = _math_verify() if use_math_verify else None
    if mv is None or not braces_balanced(prediction):
        return False
    try:
        gold = mv.parse(f"\\boxed{{{ground_truth}}}", parsing_timeout=5)
        pred = mv.parse(f"\\boxed{{{prediction}}}", parsing_timeout=5)
        return bool(gold and pred and mv.verify(gold, pred, timeout_seconds=5))
    except Exception as exc:
        log.debug("math_verify_failed", error=f"{type(exc).__name__}: {exc}")
        return False
