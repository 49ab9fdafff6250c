"""The distribution as a user installs it: a wheel named `agentx-replay` (the name `agentx` on the package index is
another project's) gives the package `agentx` and the command `agentx` in a fresh venv."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
from pathlib import Path

import pytest
from paths import REPO

from agentx.distribution import DISTRIBUTION

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
IMPORTED = "import agentx, importlib.metadata as m; print(agentx.__file__, m.version('agentx-replay'))"
EVERY_MODULE = (
    "import importlib, pkgutil, agentx\n"
    "skipped = ('__main__', '.cluster.', 'plots')  # the CLI's entry; Ray and matplotlib are optional extras\n"
    "modules = pkgutil.walk_packages(agentx.__path__, 'agentx.')\n"
    "names = [m.name for m in modules if not any(s in m.name for s in skipped)]\n"
    "for name in names:\n"
    "    importlib.import_module(name)\n"
    "from agentx.results.report.cost import load_price_table\n"
    "from agentx.spec.golden import load_golden_table\n"
    "print(len(names), len(load_price_table().gpus) > 0, len(load_golden_table().curves) > 0)"
)
"""Every module of the installed wheel imports, and its package data (the price and golden tables) is there."""


def _run(*command: str | Path, cwd: Path) -> str:
    done = subprocess.run([str(part) for part in command], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_built_wheel_installs_as_agentx_replay_with_the_agentx_command(tmp_path: Path) -> None:
    # Built from a copy: setuptools leaves a build/ folder beside the sources.
    source = tmp_path / "source"
    shutil.copytree(REPO / "agentx", source / "agentx", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", dist, source,
         cwd=tmp_path)  # fmt: skip
    (wheel,) = dist.glob("*.whl")
    assert wheel.name.startswith("agentx_replay-")
    fresh = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(fresh)
    python = fresh / "bin" / "python"
    site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path).strip())
    # The dependencies come from this venv (offline); agentx itself only from the wheel.
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run(python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", wheel, cwd=tmp_path)
    assert _run(fresh / "bin" / "agentx", "--version", cwd=tmp_path).strip() == f"agentx ({DISTRIBUTION}) {VERSION}"
    where, version = _run(python, "-c", IMPORTED, cwd=tmp_path).split()
    assert Path(where).is_relative_to(site) and version == VERSION
    modules, prices, goldens = _run(python, "-c", EVERY_MODULE, cwd=tmp_path).split()
    assert int(modules) > 150 and prices == goldens == "True"
    listed = _run(python, "-m", "pip", "list", "--format=freeze", "--path", site, cwd=tmp_path)
    assert f"{DISTRIBUTION}=={VERSION}" in listed.splitlines()
