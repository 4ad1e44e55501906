import importlib.metadata

import telescope_trainer_fsdp


def test_backend_registered_under_its_name():
    assert telescope_trainer_fsdp.BACKEND_NAME == "fsdp"
    eps = importlib.metadata.entry_points(group="telescope.trainers")
    assert "fsdp" in {ep.name for ep in eps}
