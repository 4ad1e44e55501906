"""telescope-algos' LossOptions against the config schema: every field is a TelescopeConfig field
with the packaged default, and ``loss_options`` reads a validated config whole (cross-package:
algos cannot import telescope-config)."""

from __future__ import annotations

from dataclasses import MISSING, fields

import pytest

from telescope_algos import LossOptions
from telescope_algos.backend import loss_options
from telescope_config import TelescopeConfig, defaults
from telescope_config.testing import make_config


def _config(**overrides):
    return make_config(**overrides)


def test_every_loss_option_is_a_config_field_with_the_packaged_default():
    packaged, known = defaults(), set(TelescopeConfig.model_fields)
    for f in fields(LossOptions):
        assert f.name in known, f"LossOptions.{f.name} is no TelescopeConfig field"
        assert f.default is not MISSING, f"LossOptions.{f.name} has no default"
        assert f.default == packaged[f.name], f"LossOptions.{f.name}: {f.default!r} != {packaged[f.name]!r}"


def test_loss_options_of_the_packaged_defaults_are_the_dataclass_defaults():
    assert loss_options(_config()) == LossOptions()


def test_loss_options_follow_the_config():
    cfg = _config(algorithm="gspo", clip_low=0.2, use_tis=True, tis_cap=3.0)
    options = loss_options(cfg)
    assert (options.algorithm, options.clip_low, options.use_tis, options.tis_cap) == ("gspo", 0.2, True, 3.0)


def test_a_config_without_a_loss_field_is_refused_by_name():
    class Partial:
        algorithm = "grpo"

    with pytest.raises(ValueError, match="use_ppo_clip"):
        loss_options(Partial())
