"""The bundled byte-level target/draft pair, trained on the Python standard library.

`load_bundled("target")` / `load_bundled("draft")` return `specjax.CausalLM`s; the
tokenizer is `ByteTokenizer()`; `bundled_prompts()` the held-out prompts of the demo and
the benchmarks. Model cards: `models/checkpoints/<name>/MODEL_CARD.md`.
"""

from __future__ import annotations

import json
from pathlib import Path

from specjax_models.tokenizer import VOCAB_SIZE
from specjax_models.transformer import TransformerConfig

CHECKPOINTS = Path(__file__).resolve().parent / "checkpoints"
MODEL_NAMES = ("target", "draft")
# Feature drafters of the target (and Kangaroo's adapter over its first blocks).
HEAD_NAMES = ("medusa", "eagle", "eagle3", "mtp", "kangaroo")
# The draft adapted into a parallel draft (PARD; specjax.drafters.ParallelDraft).
PARALLEL_NAME = "parallel"
# Its mask token: byte 0xFF, which never occurs in UTF-8 text (the P-EAGLE head's too).
PARALLEL_MASK_ID = 255
# The EAGLE-3 head adapted into a P-EAGLE head (specjax.drafters.ParallelEagle).
PARALLEL_HEAD_NAME = "p-eagle"
# Drafters for SmolLM2-135M-Instruct shipped with the package (see their MODEL_CARDs): an
# EAGLE-3 head, a Kangaroo adapter and a distilled layer draft (specjax_models.recipes
# trains them).
SMOLLM2_HEAD = CHECKPOINTS / "smollm2_eagle3"
SMOLLM2_KANGAROO = CHECKPOINTS / "smollm2_kangaroo"
SMOLLM2_DRAFT = CHECKPOINTS / "smollm2_draft"
# That draft adapted into a parallel draft (PARD), and its mask token: <empty_output>, a
# code-corpus special token that chat text never holds.
SMOLLM2_PARALLEL = CHECKPOINTS / "smollm2_parallel"
SMOLLM2_MASK_ID = 16
# SmolLM2's own answers as a retrieval datastore (specjax_models.recipes.smollm2_datastore).
SMOLLM2_DATASTORE = CHECKPOINTS / "smollm2_datastore.npz"
NAMES = MODEL_NAMES + HEAD_NAMES + (PARALLEL_NAME, PARALLEL_HEAD_NAME)

TARGET_CONFIG = TransformerConfig(vocab_size=VOCAB_SIZE, num_layers=6, d_model=256,
                                  num_heads=8, num_kv_heads=4, d_ff=768, max_seq_len=2048,
                                  rope_theta=10_000.0, rms_norm_eps=1e-5)
DRAFT_CONFIG = TransformerConfig(vocab_size=VOCAB_SIZE, num_layers=2, d_model=128,
                                 num_heads=4, num_kv_heads=2, d_ff=384, max_seq_len=2048,
                                 rope_theta=10_000.0, rms_norm_eps=1e-5)


def bundled_path(name: str) -> Path:
    if name not in NAMES:
        raise ValueError(f"unknown bundled model {name!r}; choose one of {NAMES}")
    return CHECKPOINTS / name


def load_bundled(name: str, dtype=None, scan_layers: bool = False, *,
                 draft_method: str | None = None, mesh=None, rules=None):
    """The bundled "target" or "draft" model as a CausalLM (`dtype`, `scan_layers`, `mesh`
    and `rules` as in `load_checkpoint`: e.g. "bfloat16" or jnp.bfloat16; default float32,
    as trained),
    or a trained feature drafter of the bundled target ("medusa", "eagle", "eagle3",
    "mtp": a `specjax.drafters.Medusa` / `Eagle` sharing the float32 target's embedding and
    LM head; "kangaroo": a `specjax.drafters.EarlyExit` adapter over its first 2 blocks;
    "parallel": the draft adapted into a `specjax.drafters.ParallelDraft`, PARD;
    "p-eagle": the EAGLE-3 head adapted into a `specjax.drafters.ParallelEagle`;
    `draft_method` "sample" or "greedy", default each drafter's)."""
    path = bundled_path(name)
    if name == PARALLEL_NAME:
        if not (path / "parallel.json").exists():
            raise FileNotFoundError(
                f"the bundled parallel draft is missing at {path}; train it with `specjax "
                f"train-drafter --method pard --out {path}`")
        from specjax_models.parallel_drafts import load_parallel_draft

        return load_parallel_draft(path, draft_method or "sample", dtype)
    if name == PARALLEL_HEAD_NAME:
        from specjax.drafters import ParallelEagle
        from specjax_models.heads import load_head_for

        if not (path / "head.npz").exists():
            raise FileNotFoundError(
                f"the bundled P-EAGLE head is missing at {path}; train it with `specjax "
                f"train-drafter --method p-eagle --out {path}`")
        from specjax.drafters.parallel_eagle import head_trained_positions

        return ParallelEagle(load_head_for(path, load_bundled("target"), draft_method),
                             trained_positions=head_trained_positions(path))
    if name in HEAD_NAMES:
        from specjax_models.heads import load_head_for

        if not (path / "head.npz").exists():
            raise FileNotFoundError(
                f"the bundled {name} head is missing at {path}; train it with `specjax "
                f"train-drafter --method {name} --out {path}`")
        return load_head_for(path, load_bundled("target"), draft_method)
    if draft_method is not None:
        raise ValueError("draft_method is for the drafters (medusa, eagle, eagle3, mtp, "
                         "kangaroo, parallel, p-eagle)")
    if mesh is None and rules is not None:
        raise ValueError("rules= needs mesh=: pass the jax.sharding.Mesh to place on")
    if not (path / "params").exists():
        raise FileNotFoundError(
            f"the bundled {name} checkpoint is missing at {path}; this checkout has no trained "
            "weights. Train them with `bash models/recipes/train_bundled.sh WORK_DIR` (see "
            "docs/checkpoints.md)")
    from specjax_models.checkpoint import load_checkpoint  # orbax: loaded when needed

    return load_checkpoint(path, dtype, scan_layers=scan_layers, mesh=mesh, rules=rules)


def bundled_prompts() -> list[dict]:
    """Held-out prompts: dicts with `file` (stdlib-relative path), `text`, `kind`
    ("continue": held-out code to continue; "copy": the same file repeated then cut)."""
    return json.loads((CHECKPOINTS / "prompts.json").read_text())
