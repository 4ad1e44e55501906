"""Lending the servers' idle cores to a training step: the lease file and the rank's threads."""

from __future__ import annotations

import os
import time

import pytest
import torch

from telescope_orchestrator.cluster.cores import CHECK_EVERY_S, CoreLease, LentCores, lent_threads, read_lease


class _Probe(torch.nn.Module):
    """Records the OpenMP threads each forward ran with."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(torch.get_num_threads())
        return x


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_the_lease_file_holds_the_last_step_granted_and_goes_with_close(tmp_path):
    lease = CoreLease(tmp_path / "lease")
    fd = os.open(lease.path, os.O_RDONLY)
    try:
        assert read_lease(fd) == 0
        lease.grant(7)
        assert read_lease(fd) == 7
        lease.grant(12)
        assert read_lease(fd) == 12
        lease.revoke()
        assert read_lease(fd) == 0
    finally:
        os.close(fd)
    lease.close()
    assert not os.path.exists(lease.path)
    own = CoreLease()  # a temp file of its own
    assert os.path.exists(own.path)
    own.close()
    assert not os.path.exists(own.path)


def test_a_step_takes_the_lent_threads_once_granted_and_gives_them_back(tmp_path, one_thread):
    lease = CoreLease(tmp_path / "lease")
    probe = _Probe()
    with lent_threads(LentCores(lease.path, 1, 2), step=3) as used:
        probe(torch.zeros(1))
        lease.grant(3)
        time.sleep(CHECK_EVERY_S * 1.5)
        probe(torch.zeros(1))
        probe(torch.zeros(1))
        time.sleep(0.05)
    assert probe.seen == [1, 2, 2]
    assert torch.get_num_threads() == 1  # back for the publish and the next step
    assert used.since is not None
    assert used.seconds >= 0.05
    probe(torch.zeros(1))
    assert probe.seen[-1] == 1  # the hook went with the step
    lease.close()


def test_a_lease_of_another_step_lends_nothing(tmp_path, one_thread):
    lease = CoreLease(tmp_path / "lease")
    lease.grant(2)  # the previous step's grant
    probe = _Probe()
    with lent_threads(LentCores(lease.path, 1, 2), step=3) as used:
        for _ in range(3):
            time.sleep(CHECK_EVERY_S * 1.2)
            probe(torch.zeros(1))
    assert probe.seen == [1, 1, 1]
    assert used.since is None
    assert used.seconds == 0.0
    lease.close()


def test_a_rank_whose_lease_file_is_gone_lends_nothing(tmp_path, one_thread):
    lease = CoreLease(tmp_path / "lease")
    lease.close()  # the driver removed it (the run ends)
    probe = _Probe()
    with lent_threads(LentCores(lease.path, 1, 2), step=1) as used:
        probe(torch.zeros(1))
    assert probe.seen == [1]
    assert used.since is None
