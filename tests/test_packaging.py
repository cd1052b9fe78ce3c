"""The wheel `pip install` builds (the notebooks' `pip install git+...`) holds every
bundled file, declared as package data: no setuptools warning that a folder of the
checkpoints "would be ignored"."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Folders a wheel build never reads; a clone's virtual environments and build outputs.
NOT_SOURCES = (".git", "*.egg-info", "build", "dist", "__pycache__", ".venv", "venv",
               ".pytest_cache", ".ruff_cache")
BUILD = "import setuptools.build_meta as backend, sys; print(backend.build_wheel(sys.argv[1]))"


def bundled_files() -> set[str]:
    """Every file the model package bundles, as the wheel names it."""
    files = {f"specjax_models/{p.relative_to(ROOT / 'models').as_posix()}"
             for folder in ("checkpoints", "recipes")
             for p in (ROOT / "models" / folder).rglob("*")
             if p.is_file() and "__pycache__" not in p.parts}
    assert any("/checkpoints/draft/" in name for name in files)  # the bundled pair is there
    return files


@pytest.mark.slow  # a wheel build: ~10 s on 2 cores
def test_the_wheel_holds_every_bundled_file_without_a_setuptools_warning(tmp_path):
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip("pyproject.toml's build needs setuptools >= 77, as pip installs it")
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*NOT_SOURCES))
    built = subprocess.run([sys.executable, "-c", BUILD, str(tmp_path / "wheel")], cwd=source,
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    log = built.stdout + built.stderr
    assert "is absent from the `packages` configuration" not in log, log[-3000:]
    wheel = tmp_path / "wheel" / built.stdout.split()[-1]
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    missing = sorted(bundled_files() - names)
    assert not missing, missing[:10]
    assert "specjax_models/bundled.py" in names and "specjax/cli/__init__.py" in names
