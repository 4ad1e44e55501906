import importlib.metadata

import telescope_trainer_megatron


def test_backend_registered_under_its_name():
    assert telescope_trainer_megatron.BACKEND_NAME == "megatron"
    eps = importlib.metadata.entry_points(group="telescope.trainers")
    assert "megatron" in {ep.name for ep in eps}
