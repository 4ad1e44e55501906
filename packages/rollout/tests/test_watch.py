"""FailureWatch's two rules and their messages, worked by hand."""

from __future__ import annotations

from telescope_rollout.engine._watch import FailureWatch, same_error_message, unfit_message


def test_unfit_streak_stops_at_the_count_and_a_fitting_prompt_starts_it_over():
    w = FailureWatch(max_unfit=3, max_same_error=8)
    assert w.prompt_unfit("a", 0, 300, candidates=100) is None
    assert w.prompt_unfit("a", 1, 500, candidates=100) is None
    w.prompt_fits("a")  # streak 2 -> 0
    assert w.prompt_unfit("a", 2, 400, candidates=100) is None
    assert w.prompt_unfit("a", 3, 700, candidates=100) is None
    streak = w.prompt_unfit("a", 3, 700, candidates=100)  # third in a row (the same index twice)
    assert streak is not None
    assert (streak.count, streak.indices, streak.longest, streak.shortest) == (3, {2, 3}, 700, 400)


def test_unfit_streaks_are_per_environment():
    w = FailureWatch(max_unfit=2, max_same_error=8)
    assert w.prompt_unfit("a", 0, 300, candidates=100) is None
    w.prompt_fits("b")  # another environment's fitting prompt does not reset a's streak
    assert w.prompt_unfit("b", 0, 300, candidates=100) is None
    assert w.prompt_unfit("a", 1, 300, candidates=100) is not None


def test_unfit_stops_once_every_candidate_was_seen_not_just_after_len_draws():
    # 3 candidates drawn with replacement: 0, 0, 1 is 3 draws, but index 2 might fit;
    # 0, 0, 1, 2 proves none does
    w = FailureWatch(max_unfit=32, max_same_error=8)
    assert [w.prompt_unfit("a", i, 10, candidates=3) for i in (0, 0, 1)] == [None, None, None]
    streak = w.prompt_unfit("a", 2, 10, candidates=3)
    assert streak is not None
    assert (streak.count, len(streak.indices)) == (4, 3)


def test_same_error_run_counts_all_failed_groups_of_one_kind():
    w = FailureWatch(max_unfit=32, max_same_error=3)
    assert w.group_failed(["sample_error", "sample_error"], "a", "compute_reward raised X") is None
    assert w.group_failed(["sample_error", "sample_error"], "b", "compute_reward raised Y") is None
    run = w.group_failed(["sample_error", "sample_error"], "a", "compute_reward raised Z")
    assert run is not None
    assert (run.count, run.kind, run.envs) == (3, "sample_error", ["a", "b"])
    assert run.first_detail == "compute_reward raised X"


def test_same_error_run_starts_over_on_progress_another_kind_or_a_partial_failure():
    w = FailureWatch(max_unfit=32, max_same_error=2)
    both = ["sample_error", "sample_error"]
    assert w.group_failed(both, "a", "x") is None
    w.group_ok()  # a kept (or zero_advantage / max_async) group
    assert w.group_failed(both, "a", "x") is None
    assert w.group_failed(["rollout_error", "rollout_error"], "a", "y") is None  # another kind: count 1
    assert w.errors.count == 1
    assert w.group_failed(["rollout_error", None], "a", "y") is None  # one sample succeeded
    assert w.errors.count == 0
    assert w.group_failed(["rollout_error", "sample_error"], "a", "y") is None  # mixed in the group
    assert w.errors.count == 0
    assert w.group_failed(both, "a", "x") is None
    assert w.group_failed(both, "a", "x") is not None


def test_unfit_message_names_the_environment_lengths_settings_and_the_rule():
    w = FailureWatch(max_unfit=32, max_same_error=8)
    for i, n in enumerate([620, 1203]):
        streak = w.prompt_unfit("long_docs", i, n, candidates=2)
    assert streak is not None
    msg = unfit_message("long_docs", streak, candidates=2, max_model_len=256, max_tokens=16, limit=32)
    assert msg == (
        "environment 'long_docs' has no prompt that fits the context: none of the last 2 prompts drawn "
        "from it fits (they are all 2 of its training prompts). The longest has 1203 prompt tokens, "
        "the shortest 620; a prompt fits when its token count is below max_model_len (256). "
        "max_tokens (16) is not the cause: it is shortened to max_model_len minus the prompt's tokens, "
        "so lowering it does not help. Fix: raise max_model_len to at least 1219 (the longest prompt "
        "plus max_tokens), or shorten the prompts or filter the dataset to prompts under 256 tokens."
    )


def test_unfit_message_after_the_count_points_at_the_setting():
    w = FailureWatch(max_unfit=2, max_same_error=8)
    w.prompt_unfit("big", 7, 900, candidates=1000)
    streak = w.prompt_unfit("big", 8, 900, candidates=1000)
    assert streak is not None
    msg = unfit_message("big", streak, candidates=1000, max_model_len=512, max_tokens=64, limit=2)
    assert "(2 in a row, of its 1000 training prompts; if only some are too long, raise " in msg
    assert "max_consecutive_unfit_prompts (now 2))" in msg
    assert "Each has 900 prompt tokens;" in msg
    assert "at least 964 " in msg


def test_same_error_message_is_one_line_with_the_first_error():
    w = FailureWatch(max_unfit=32, max_same_error=2)
    detail = "compute_reward raised RuntimeError: i3_code needs a sandbox\n  (pass one)"
    w.group_failed(["sample_error"], "i3_code", detail)
    run = w.group_failed(["sample_error"], "i3_code", "later")
    assert run is not None
    assert same_error_message(run) == (
        "every sample of the last 2 groups failed with sample_error (environment i3_code): "
        "compute_reward raised RuntimeError: i3_code needs a sandbox (pass one); the run cannot make "
        "progress. Fix the cause above (the environment, its resources or the servers) and start again."
    )
    run.envs.append("math")
    run.first_detail = "x" * 600
    msg = same_error_message(run, detail_chars=10)
    assert "(environments i3_code, math): xxxxxxx...;" in msg
