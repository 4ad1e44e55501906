"""The weight-sync settings `telescope train` derives from the config (`PublisherSettings.from_config`)."""

from __future__ import annotations

import dataclasses

import telescope_config
from telescope_weightsync import PublisherSettings


def _resolved(tmp_path, **fields):
    path = tmp_path / "run.yaml"
    fields = {"environments": "[{name: countdown}]", **fields}
    path.write_text("".join(f"{k}: {v}\n" for k, v in fields.items()))
    return telescope_config.load_config(path, [])


def test_unset_bucket_size_is_left_to_the_transport(tmp_path):
    resolved = _resolved(tmp_path)
    settings = PublisherSettings.from_config(resolved.config, user_keys=resolved.user_keys)
    assert settings.bucket_mb is None
    assert dataclasses.replace(settings, backend="gloo").bucket_bytes == 32 * 2**20


def test_a_bucket_size_the_user_set_is_kept(tmp_path):
    resolved = _resolved(tmp_path, weight_broadcast_bucket_mb=64)
    settings = PublisherSettings.from_config(resolved.config, user_keys=resolved.user_keys)
    assert settings.bucket_mb == 64
    assert dataclasses.replace(settings, backend="gloo").bucket_bytes == 64 * 2**20
