"""``telescope_algos.testing.run_ranks``: every rank gets its place in the world, a failing or
hung rank is an error that shows each rank's log, and no rank outlives it."""

from __future__ import annotations

import json
import time

import pytest

from telescope_algos.testing import run_ranks

SCRIPT = """
import json, os, sys, time
out = os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json")
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "EXTRA")
json.dump({k: os.environ.get(k) for k in keys}, open(out, "w"))
print("rank", os.environ["RANK"], "says", sys.argv[2])
if sys.argv[2] == "fail" and os.environ["RANK"] == "1":
    sys.exit(3)
if sys.argv[2] in ("hang", "fail"):
    time.sleep(60)
"""


def test_each_rank_knows_its_place_and_writes_its_log(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(SCRIPT)
    run_ranks(script, [str(tmp_path), "ok"], world=2, log_dir=tmp_path / "logs", env={"EXTRA": "x"})
    envs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [(e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"]) for e in envs] == [("0", "0", "2"), ("1", "1", "2")]
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
    assert envs[0]["MASTER_ADDR"] == "127.0.0.1"
    assert (envs[0]["OMP_NUM_THREADS"], envs[0]["EXTRA"]) == ("1", "x")
    assert (tmp_path / "logs" / "rank_1.log").read_text() == "rank 1 says ok\n"


def test_a_failing_rank_stops_the_others_at_once_with_every_ranks_log(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(SCRIPT)
    t0 = time.monotonic()
    failed = r"worker\.py on 2 rank\(s\) failed: exit codes \[-9, 3\]"
    with pytest.raises(AssertionError, match=failed) as err:
        run_ranks(script, [str(tmp_path), "fail"], world=2, log_dir=tmp_path, timeout_s=50)
    assert time.monotonic() - t0 < 40  # rank 0 would have slept 60 s
    assert "--- rank 1 (exit 3)\nrank 1 says fail" in str(err.value)


def test_ranks_past_the_timeout_are_killed(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(SCRIPT)
    with pytest.raises(AssertionError, match=r"did not finish within 2 s: exit codes \[-9, -9\]"):
        run_ranks(script, [str(tmp_path), "hang"], world=2, log_dir=tmp_path, timeout_s=2)


RACE = """
import os, sys
tries = os.path.join(sys.argv[1], "tries_" + os.environ["RANK"])
ports = open(tries).read().split() if os.path.exists(tries) else []
open(tries, "w").write(" ".join([*ports, os.environ["MASTER_PORT"]]))
if len(ports) < int(sys.argv[2]) and os.environ["RANK"] == "0":
    print("DistNetworkError: The server socket has failed to listen ... EADDRINUSE, address already in use")
    sys.exit(1)
"""


def test_a_master_port_taken_before_rank_0_binds_it_is_tried_again_on_another_port(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(RACE)
    run_ranks(script, [str(tmp_path), "1"], world=2, log_dir=tmp_path / "logs")
    ports = (tmp_path / "tries_0").read_text().split()
    assert len(ports) == 2  # started twice (free_port() may hand out the same port again)


def test_a_port_lost_three_times_is_an_error_with_the_logs(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(RACE)
    with pytest.raises(
        AssertionError, match=r"failed: exit codes \[1, (0|-9)\]"
    ) as err:  # rank 1 may be stopped
        run_ranks(script, [str(tmp_path), "9"], world=2, log_dir=tmp_path / "logs")
    assert "EADDRINUSE" in str(err.value)
    assert len((tmp_path / "tries_0").read_text().split()) == 3
