"""Answer parsers for reward functions: pure string functions, safe on any input.

Every parser runs in linear time on adversarial input (no backtracking regex over the whole
text) and returns None instead of raising when nothing is found.
"""

from __future__ import annotations

import re

_BOXED = "\\boxed{"
_NUMBER = re.compile(r"-?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?")
_WS = re.compile(r"\s+")


def strip_think_tags(text: str) -> str:
    """The text after the last ``</think>``, or the whole text when there is none."""
    _, sep, after = text.rpartition("</think>")
    return after if sep else text


def strip_eos(text: str, eos_token: str | None) -> str:
    """``text`` without trailing copies of ``eos_token`` (reward functions strip it defensively)."""
    if eos_token:
        while text.endswith(eos_token):
            text = text[: -len(eos_token)]
    return text


def _balanced_from(text: str, i: int) -> str | None:
    depth = 1
    for j in range(i, len(text)):
        ch = text[j]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def extract_boxed_answer(text: str) -> str | None:
    """The contents of the last ``\\boxed{...}`` with balanced braces, or None.

    Falls back to a bare ``boxed{`` (the backslash is often lost in JSON-escaped text). An
    unterminated box yields None rather than a partial answer.
    """
    start = text.rfind(_BOXED)
    if start >= 0:
        return _balanced_from(text, start + len(_BOXED))
    start = text.rfind("boxed{")
    if start >= 0:
        return _balanced_from(text, start + len("boxed{"))
    return None


def extract_xml_tag(text: str, tag: str) -> str | None:
    """The contents of the last complete ``<tag>...</tag>`` pair (tag name case-insensitive)."""
    name = re.escape(tag)
    closes = list(re.finditer(rf"</{name}\s*>", text, re.IGNORECASE))
    if not closes:
        return None
    end = closes[-1].start()
    opens = list(re.finditer(rf"<{name}(?:\s[^<>]*)?>", text[:end], re.IGNORECASE))
    if not opens:
        return None
    return text[opens[-1].end() : end]


def extract_answer_tags(text: str) -> str | None:
    """The stripped contents of the last ``<answer>...</answer>``, or None."""
    found = extract_xml_tag(text, "answer")
    return None if found is None else found.strip()


_LANG_ALIASES = {"python": {"python", "py", "python3"}, "cpp": {"cpp", "c++"}}


def extract_code_block(text: str, language: str | None = "python") -> str | None:
    """The last closed fenced code block, preferring blocks tagged with ``language``."""
    parts = text.split("```")
    blocks: list[tuple[str, str]] = []
    for k in range(1, len(parts) - 1, 2):
        info, _, body = parts[k].partition("\n")
        blocks.append((info.strip().lower(), body))
    if not blocks:
        return None
    if language:
        wanted = _LANG_ALIASES.get(language.lower(), {language.lower()})
        for info, body in reversed(blocks):
            if info in wanted:
                return body
    return blocks[-1][1]


def extract_last_number(text: str) -> str | None:
    """The last ASCII number in ``text`` (``-12``, ``3.5``, ``1,234`` → ``1234``), or None."""
    last = None
    for m in _NUMBER.finditer(text):
        last = m
    if last is None:
        return None
    value = last.group(0).replace(",", "")
    if "." in value:
        value = value.rstrip("0").rstrip(".")
    return "0" if value in ("-0", "") else value


def normalize_whitespace(text: str) -> str:
    """``text`` with each run of whitespace as one space, stripped."""
    return _WS.sub(" ", text).strip()


def verify_exact_match(prediction: str | None, ground_truth: str | None) -> bool:
    """Equality after collapsing whitespace; None never matches."""
    if prediction is None or ground_truth is None:
        return False
    return normalize_whitespace(prediction) == normalize_whitespace(ground_truth)
