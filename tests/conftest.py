"""Make this folder's helper modules (``e2e_support``, ``e2e_envs``) importable by its tests."""

import sys
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
