"""Our models as transformers models with the very same weights, for side-by-side
measurements (benchmarks only; PyTorch CPU): exported with `specjax_models.save_pretrained` and
loaded back with `AutoModelForCausalLM`."""

from __future__ import annotations

import tempfile

import specjax
import specjax_models


def to_transformers(model: specjax_models.Transformer | specjax.CausalLM):
    """A float32 transformers model (LlamaForCausalLM for our Llama-family models)."""
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as directory:
        specjax_models.save_pretrained(model, directory, dtype="float32")
        return AutoModelForCausalLM.from_pretrained(directory).eval()
