"""``PublisherSettings.from_config`` against the real run config: every setting has its field.

telescope-weightsync does not import telescope-config, so only a test that sees both packages can
check that each setting names an existing ``TelescopeConfig`` field, that a run with the packaged
defaults gets the settings' own defaults, and that every value set in a config reaches them.
"""

from __future__ import annotations

import dataclasses

import pytest

from telescope_config import TelescopeConfig, defaults
from telescope_config.testing import make_config
from telescope_weightsync import PublisherSettings

CONFIG_FIELDS = PublisherSettings.CONFIG_FIELDS
DEFAULT_BUCKET_MB = PublisherSettings.DEFAULT_BUCKET_MB

SETTINGS = {f.name: f for f in dataclasses.fields(PublisherSettings)}
NOT_IN_THE_CONFIG = {"backend"}


def _config(**values) -> TelescopeConfig:
    return make_config(**values)


def test_every_setting_is_mapped_or_knowingly_left_out():
    assert set(CONFIG_FIELDS) | NOT_IN_THE_CONFIG == set(SETTINGS)
    assert not set(CONFIG_FIELDS) & NOT_IN_THE_CONFIG


@pytest.mark.parametrize(("setting", "field"), sorted(CONFIG_FIELDS.items()))
def test_each_setting_maps_to_a_config_field(setting, field):
    assert field in TelescopeConfig.model_fields, f"{setting} -> {field}: no such config field"


@pytest.mark.parametrize(("setting", "field"), sorted(CONFIG_FIELDS.items()))
def test_each_default_equals_the_packaged_default(setting, field):
    packaged = defaults()[field]
    if setting == "bucket_mb":
        # None lets the transport choose: on NCCL that is the packaged value, on gloo a smaller one.
        assert SETTINGS[setting].default is None
        assert DEFAULT_BUCKET_MB["nccl"] == packaged
    else:
        assert SETTINGS[setting].default == packaged


def test_a_run_on_the_packaged_defaults_gets_the_default_settings():
    assert PublisherSettings.from_config(_config(), user_keys=frozenset()) == PublisherSettings()


def test_every_value_set_in_the_config_reaches_its_setting():
    changed = {
        "weight_broadcast_mode": "per_tensor",
        "weight_broadcast_bucket_mb": 64,
        "weight_broadcast_cpu_staging": True,
        "weight_broadcast_pin_memory": False,
        "ray_broadcast_init_timeout_s": 42,
        "weight_broadcast_timeout_s": 43,
    }
    assert set(changed) == set(CONFIG_FIELDS.values())
    settings = PublisherSettings.from_config(_config(**changed), user_keys=frozenset(changed))
    for setting, field in CONFIG_FIELDS.items():
        assert getattr(settings, setting) == changed[field], setting
        assert getattr(settings, setting) != SETTINGS[setting].default, setting
    assert settings.backend == SETTINGS["backend"].default


def test_a_bucket_size_the_run_did_not_set_is_left_to_the_transport():
    cfg = _config(weight_broadcast_bucket_mb=64)
    assert PublisherSettings.from_config(cfg, user_keys=frozenset()).bucket_mb is None
    kept = PublisherSettings.from_config(cfg, user_keys={"weight_broadcast_bucket_mb"})
    assert dataclasses.replace(kept, backend="gloo").bucket_bytes == 64 * 2**20
