from telescope_weightsync import WeightVersion


def test_versions_count_updates():
    base = WeightVersion()
    assert base.value == -1
    v2 = base.next().next()
    assert v2.value == 1
    assert base.steps_behind(v2) == 2
    assert v2.steps_behind(base) == 0
    assert base < v2
