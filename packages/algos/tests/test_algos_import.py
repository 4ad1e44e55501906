"""telescope_algos stays slim: a fresh interpreter loads no other telescope package and no pydantic."""

import subprocess
import sys

import telescope_algos as ta

CODE = """
import sys
import telescope_algos
bad = sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic'
             or (m.startswith('telescope') and m.split('.')[0] != 'telescope_algos'))
print(repr(bad))
"""


def test_import_loads_no_sibling_and_no_pydantic():
    out = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"


def test_public_names_exist():
    for name in ta.__all__:
        assert hasattr(ta, name), name
    for name in ta.backend.__all__:
        assert hasattr(ta.backend, name), name
    # the root is the math; what the backends share is in the namespace, not in both
    assert not set(ta.__all__) & set(ta.backend.__all__)
    assert len(ta.__all__) <= 50
    assert ta.ALGORITHMS == ("grpo", "rloo", "reinforce_pp", "dr_grpo", "cispo", "gspo", "sapo", "opd")
