"""colab/: every notebook runs top to bottom (small-size mode) without an error."""

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

COLAB = Path(__file__).resolve().parents[1] / "colab"


@pytest.mark.parametrize("name", sorted(p.name for p in COLAB.glob("*.ipynb")))
def test_notebook_runs_in_small_mode(name, monkeypatch):
    monkeypatch.setenv("SPECJAX_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(COLAB / name, as_version=4)
    # nbclient's timeout bounds a hung cell; it is not a speed assertion.
    nbclient.NotebookClient(notebook, timeout=1800, kernel_name="python3",
                            resources={"metadata": {"path": str(COLAB)}}).execute()
    outputs = [o for cell in notebook.cells for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    os.environ.pop("SPECJAX_NOTEBOOK_SMALL", None)
