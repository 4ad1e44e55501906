import subprocess
import sys
import time

import pytest

from telescope_rollout.parsers import (
    extract_answer_tags,
    extract_boxed_answer,
    extract_code_block,
    extract_last_number,
    extract_xml_tag,
    strip_eos,
    strip_think_tags,
    verify_exact_match,
)


def test_boxed_nested_and_last():
    assert extract_boxed_answer(r"x \boxed{1} then \boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert extract_boxed_answer("no box") is None
    assert extract_boxed_answer(r"\boxed{unterminated {") is None
    assert extract_boxed_answer(r"\boxed{}") == ""


def test_strip_think():
    assert strip_think_tags("<think>a</think>b</think> c") == " c"
    assert strip_think_tags("plain") == "plain"


def test_import_loads_no_torch():
    code = (
        "import sys, telescope_rollout; bad = {'torch', 'vllm', 'transformers'} & set(sys.modules); "
        "print(sorted(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- the other parsers, on tricky inputs -------------------------------------------------------


def test_boxed_fallbacks_and_unicode():
    assert extract_boxed_answer("answer: boxed{7}") == "7"  # lost backslash
    assert extract_boxed_answer(r"\boxed{π/2} and 東京") == "π/2"
    assert extract_boxed_answer("") is None
    assert extract_boxed_answer(r"\boxed{a}\boxed{") is None  # last box unterminated


def test_answer_and_xml_tags():
    assert extract_answer_tags("<answer> 1+2 </answer> x <answer>3</answer>") == "3"
    assert extract_answer_tags("<answer>5</answer> then <answer>unclosed") == "5"
    assert extract_answer_tags("<ANSWER>é</Answer>") == "é"
    assert extract_answer_tags("</answer><answer>") is None
    assert extract_answer_tags("") is None
    assert extract_xml_tag('<guess kind="w">crane</guess>', "guess") == "crane"
    assert extract_xml_tag("<a.b>x</a.b>", "a.b") == "x"  # tag names are escaped


def test_code_block():
    text = "```js\nno\n```\n```python\nprint(1)\n```\n```\nplain\n```"
    assert extract_code_block(text) == "print(1)\n"
    assert extract_code_block(text, "js") == "no\n"
    assert extract_code_block(text, "rust") == "plain\n"  # falls back to the last block
    assert extract_code_block("```py\nx=1\n```") == "x=1\n"
    assert extract_code_block("```python\nunclosed") is None
    assert extract_code_block("") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is 42.", "42"),
        ("-7 degrees", "-7"),
        ("1,234,567 apples", "1234567"),
        ("3.50 then 2.0", "2"),
        ("no digits", None),
        ("١٢٣ arabic-indic digits are not ASCII", None),
        ("", None),
        ("x=0.0", "0"),
        ("-0", "0"),
    ],
)
def test_last_number(text, expected):
    assert extract_last_number(text) == expected


def test_exact_match_and_eos():
    assert verify_exact_match("  a \n b ", "a b")
    assert not verify_exact_match(None, "a")
    assert not verify_exact_match("a", "A")
    assert strip_eos("hi<|im_end|><|im_end|>", "<|im_end|>") == "hi"
    assert strip_eos("hi", "") == "hi"


def test_parsers_linear_on_adversarial_megabytes():
    nasty = [
        "\\boxed{" * 200_000,
        "<answer>" * 100_000,
        "```" * 300_000,
        "1," * 500_000,
        "</think>" * 100_000,
    ]
    t0 = time.perf_counter()
    for text in nasty:
        extract_boxed_answer(text)
        extract_answer_tags(text)
        extract_code_block(text)
        extract_last_number(text)
        strip_think_tags(text)
    assert time.perf_counter() - t0 < 5.0
