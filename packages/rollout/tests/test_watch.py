"""FailureWatch's rules and their messages, worked by hand."""

from __future__ import annotations

from telescope_rollout.engine._watch import (
    FailureWatch,
    flat_environment_message,
    flat_run_message,
    same_error_message,
    unfit_message,
)


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
    both: list[str | None] = ["sample_error", "sample_error"]
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


def test_zero_advantage_groups_count_until_a_kept_group_and_other_drops_neither_count_nor_reset():
    w = FailureWatch(max_unfit=32, max_same_error=8, max_zero_advantage=3)
    assert w.group_flat("a", 0.0) == (None, None)
    assert w.group_flat("a", 0.0) == (None, None)
    w.group_kept("a")  # count 2 -> 0
    assert w.group_flat("a", 0.0) == (None, None)
    # a group dropped for max_async, an error or a cancel is not reported to the rule at all;
    # group_ok (the same-error rule's reset) leaves this count alone
    w.group_ok()
    assert w.group_flat("a", 1.0) == (None, None)
    hopeless, env = w.group_flat("a", 0.0)
    assert hopeless is not None
    assert env is not None
    assert hopeless.count == 3
    tally = hopeless.rewards["a"]
    assert (tally.groups, tally.low, tally.high, tally.values) == (3, 0.0, 1.0, {0.0: 2, 1.0: 1})


def test_a_kept_group_of_one_environment_resets_the_run_but_not_another_environment():
    w = FailureWatch(max_unfit=32, max_same_error=8, max_zero_advantage=2)
    assert w.group_flat("flat", 0.0) == (None, None)
    w.group_kept("fine")  # run: 1 -> 0; flat's own count stays 1
    hopeless, env = w.group_flat("flat", 0.0)
    assert hopeless is None  # the run's count is 1
    assert env is not None
    assert env.count == 2
    w.group_kept("fine")
    assert w.group_flat("flat", 0.0) == (None, None)  # 3: not a multiple of 2
    hopeless, env = w.group_flat("flat", 0.0)  # run 2 (hopeless), flat 4 (named again)
    assert hopeless is not None
    assert hopeless.count == 2
    assert env is not None
    assert env.count == 4


def test_zero_advantage_rule_off_counts_but_never_stops():
    w = FailureWatch(max_unfit=32, max_same_error=8, max_zero_advantage=0)
    assert all(w.group_flat("a", 0.0) == (None, None) for _ in range(1000))
    assert w.flat.count == 1000


def test_flat_run_message_names_groups_rewards_and_fixes():
    w = FailureWatch(max_unfit=32, max_same_error=8, max_zero_advantage=4)
    for env, reward in (("count", 0.0), ("math", 0.0), ("count", 0.0), ("math", 1.0)):
        hopeless, _ = w.group_flat(env, reward)
    assert hopeless is not None
    msg = flat_run_message(hopeless, limit_batches=2, batch_size=2)
    assert msg.startswith(
        "no group was kept in the last 4 groups: every one was dropped for zero advantage (all its "
        "samples got the same reward, so it carries nothing to learn), 2 batches' worth of 2 groups; "
        "count: every group scored 0.0; math: 1 group scored 0.0, 1 scored 1.0. The run cannot make "
        "progress. Check the reward on a few samples: `telescope ui` shows"
    )
    assert "set discard_group_zero_advantage: false" in msg
    assert msg.endswith("or raise max_zero_advantage_batches (now 2; 0 waits forever).")


def test_flat_environment_message_names_the_environment_and_its_rewards():
    w = FailureWatch(max_unfit=32, max_same_error=8, max_zero_advantage=2)
    w.group_flat("count", 0.0)
    _, env = w.group_flat("count", 0.0)
    assert env is not None
    msg = flat_environment_message("count", env)
    assert msg.startswith(
        "environment 'count' trains nothing: its last 2 groups were all dropped for zero advantage "
        "(every group scored 0.0) while other environments' groups were kept. Check the reward"
    )
