import pytest

from telescope_rollout.envs import verify_math_answer
from telescope_rollout.envs._math import fallback_math_equal, normalize_math_answer


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("42", "42"),
        ("$42$", "42"),
        ("\\frac{3}{4}", "0.75"),
        ("\\dfrac{3}{4}", "\\frac{3}{4}"),
        ("3/4", "\\frac34"),
        ("x = 5", "5"),
        ("1,000", "1000"),
        ("90^\\circ", "90"),
        ("\\text{(B)}", "(B)"),
        ("\\left(1, 2\\right)", "(1,2)"),
        ("5.", "5"),
        ("\\boxed{7}", "7"),
    ],
)
def test_equal(pred, gold):
    assert verify_math_answer(pred, gold, use_math_verify=False)


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("41", "42"),  # almost right
        ("4.2", "42"),
        ("", "42"),
        (None, "42"),
        ("42", ""),
        ("4" * 501, "4" * 501),  # over 500 characters
        ("1/0", "1/0x"),
        ("\\frac{1}{0}", "0"),
        ("九", "9"),
    ],
)
def test_not_equal(pred, gold):
    assert not verify_math_answer(pred, gold, use_math_verify=False)


def test_normalize_is_total():
    for s in ["", "$", "\\boxed{", "}{", "x=", "\x00" * 10, "🙂" * 1000]:
        assert isinstance(normalize_math_answer(s), str)
        assert fallback_math_equal(s, s + "1") in (True, False)


def test_with_math_verify_when_installed():
    import math_verify  # noqa: F401  (installed in every test environment of this package)

    assert verify_math_answer("\\sqrt{4}", "2")


def test_a_missing_math_verify_is_warned_about_once(monkeypatch):
    import builtins

    from structlog.testing import capture_logs

    from telescope_rollout.envs import _math

    real_import = builtins.__import__

    def no_math_verify(name, *args, **kwargs):
        if name == "math_verify":
            raise ImportError("No module named 'math_verify'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_math_verify)
    _math._math_verify.cache_clear()
    try:
        with capture_logs() as logs:
            # equal values the fallback does not normalise: math-verify would say yes, the fallback no
            assert not verify_math_answer("\\sqrt{4}", "2")
            assert not verify_math_answer("2^{1}", "2")
        warnings = [e for e in logs if e["event"] == "math_verify_missing"]
        assert len(warnings) == 1
        assert warnings[0]["log_level"] == "warning"
        assert "pip install math-verify" in warnings[0]["fix"]
        assert "telescope-rollout[math]" in warnings[0]["fix"]
    finally:
        _math._math_verify.cache_clear()  # the next caller finds the installed math-verify again
