"""Our models as transformers models with the very same weights, for side-by-side
measurements (benchmarks only; PyTorch CPU): exported with `models.save_pretrained` and
loaded back with `AutoModelForCausalLM`."""

from __future__ import annotations

import tempfile

import models
import specjax


def to_transformers(model: models.Transformer | specjax.CausalLM):
    """A float32 transformers model (LlamaForCausalLM for our Llama-family models)."""
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as directory:
        models.save_pretrained(model, directory, dtype="float32")
        return AutoModelForCausalLM.from_pretrained(directory).eval()
