"""Make this folder's helper modules (megatron_families, megatron_spawn) importable by the tests
(the tiny tensor-parallel-ready model they share, ``tiny_tp_model``, is the root conftest's)."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
