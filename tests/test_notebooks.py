"""colab/: every notebook runs top to bottom (small-size mode) without an error."""

import os
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

COLAB = Path(__file__).resolve().parents[1] / "colab"


@pytest.mark.parametrize("name", sorted(p.name for p in COLAB.glob("*.ipynb")))
def test_notebook_runs_in_small_mode(name, monkeypatch):
    monkeypatch.setenv("SPECJAX_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(COLAB / name, as_version=4)
    start = time.perf_counter()
    nbclient.NotebookClient(notebook, timeout=240, kernel_name="python3",
                            resources={"metadata": {"path": str(COLAB)}}).execute()
    seconds = time.perf_counter() - start
    outputs = [o for cell in notebook.cells for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert seconds < 240, f"{name} took {seconds:.0f}s"
    os.environ.pop("SPECJAX_NOTEBOOK_SMALL", None)
