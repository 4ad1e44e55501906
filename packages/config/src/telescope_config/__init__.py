"""Telescope's run configuration: one flat, strictly validated schema with packaged defaults.

A run resolves three layers, later winning: the packaged ``defaults.yaml``, the run YAML
(``--config FILE``) and command-line overrides (``--learning_rate 5e-7``). ``load_config``
returns a ``ResolvedConfig`` or raises one ``ConfigError`` that lists every problem found.
docs/config.md describes the loading, the overrides and the cross-field rules.
"""

from telescope_config.__about__ import __version__
from telescope_config._entries import EnvironmentEntry, EvalEntry
from telescope_config._errors import ConfigError, Problem
from telescope_config._load import ResolvedConfig, load_config
from telescope_config._overrides import parse_overrides
from telescope_config._render import json_schema
from telescope_config._schema import TelescopeConfig, num_inference_servers
from telescope_config._yaml import defaults

__all__ = [
    # Loading a run's config
    "ResolvedConfig",
    "load_config",
    "parse_overrides",
    # The schema
    "EnvironmentEntry",
    "EvalEntry",
    "TelescopeConfig",
    "num_inference_servers",
    # What went wrong, for the user
    "ConfigError",
    "Problem",
    # The packaged defaults and the JSON Schema for editors
    "defaults",
    "json_schema",
    # Package
    "__version__",
]
