"""The weight-sync settings `telescope train` derives from the config."""

from __future__ import annotations

import telescope_config
from telescope_cli._train import _publisher_settings
from telescope_weightsync import PublisherSettings


def _resolved(tmp_path, **fields):
    path = tmp_path / "run.yaml"
    fields = {"environments": "[{name: countdown}]", **fields}
    path.write_text("".join(f"{k}: {v}\n" for k, v in fields.items()))
    return telescope_config.load_config(path, [])


def test_unset_bucket_size_is_left_to_the_transport(tmp_path):
    resolved = _resolved(tmp_path)
    values = _publisher_settings(resolved.config, resolved.user_keys)
    assert values["bucket_mb"] is None
    assert PublisherSettings(**values, backend="gloo").bucket_bytes == 32 * 2**20


def test_a_bucket_size_the_user_set_is_kept(tmp_path):
    resolved = _resolved(tmp_path, weight_broadcast_bucket_mb=64)
    values = _publisher_settings(resolved.config, resolved.user_keys)
    assert values["bucket_mb"] == 64
    assert PublisherSettings(**values, backend="gloo").bucket_bytes == 64 * 2**20
