"""SmolLM2's distilled layer draft adapted into a parallel draft (PARD): it reads the
committed tokens and then K - 1 mask tokens and proposes all K drafts in one forward
(`specjax.ParallelDraft`).

Same data as the autoregressive layer draft (`smollm2_draft`: the target's cached answers
and top-k probabilities in the shared work directory, the same held-out rows), the same
draft vocabulary and the same frozen embedding and head rows; the adaptation starts from a
trained layer draft (the shipped one by default) and trains its blocks and final norm with
`specjax.training.train_parallel` (PARD's packed layout with conditional drop tokens). The
mask token is `SMOLLM2_MASK_ID` (`<empty_output>`, a code-corpus special token chat text
never holds); its embedding row is the target's, frozen: the blocks learn to read it.

`specjax train-drafter --model smollm2 --method pard --out DIR` runs it.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from specjax.training import ParallelTrainConfig, TrainConfig, draft_label_index, train_parallel
from specjax_models.bundled import SMOLLM2_DRAFT
from specjax_models.layer_draft import (
    SHARED,
    load_layer_draft,
    parallel_layer_settings,
    save_layer_draft,
    trained_arrays,
)
from specjax_models.recipes.smollm2_head import (
    copy_data_log,
    data_summary,
    heldout_split,
    load_chat_data,
    write_run_record,
)
from specjax_models.transformer import with_attention_blocks


def train_chat_parallel_draft(target, target_config, work_dir: str | Path,
                              out_dir: str | Path, *, parallel: ParallelTrainConfig,
                              train_config: TrainConfig,
                              start: str | Path = SMOLLM2_DRAFT, batch_size: int = 16,
                              heldout_rows: int = 32, seed: int = 0,
                              max_seconds: float | None = None) -> dict:
    """Adapt the layer draft in `start` into a parallel draft on the cached chunks of
    `work_dir` (checkpoints in `work_dir/run_parallel_K<positions>`), written to `out_dir`
    with its mask token, metadata.json and history.jsonl. Returns the metadata."""
    work_dir, out_dir, start = Path(work_dir), Path(out_dir), Path(start)
    if parallel_layer_settings(start) is not None:
        raise ValueError(f"{start} is a parallel draft already; start from an autoregressive "
                         "layer draft (specjax train-drafter --model smollm2 --method draft)")
    initial = load_layer_draft(start, target)  # refuses a draft of another target
    layers = json.loads((start / "draft.json").read_text())["layers"]
    vocab = np.asarray(initial.draft_vocab)
    if parallel.mask_id >= target_config.vocab_size:
        raise ValueError(f"mask_id {parallel.mask_id} is not an id of the target's vocabulary "
                         f"[0, {target_config.vocab_size})")
    data = load_chat_data(work_dir, hidden=False)
    held, train_rows = heldout_split(len(data["tokens"]), heldout_rows, batch_size, seed)

    def arrays(cached, rows) -> dict:
        return {"tokens": cached["tokens"][rows], "loss_mask": cached["loss_mask"][rows],
                "label_index": draft_label_index(cached["top_ids"][rows], vocab,
                                                 target_config.vocab_size),
                "label_probs": cached["top_probs"][rows]}

    held_arrays = arrays(data, held)
    heldout = [{k: v[i:i + batch_size] for k, v in held_arrays.items()}
               for i in range(0, heldout_rows, batch_size)]
    train_arrays = arrays(data, train_rows)
    length = train_arrays["tokens"].shape[1]
    if (train_arrays["tokens"] == parallel.mask_id).any():
        raise ValueError(f"the mask id {parallel.mask_id} occurs in the cached texts; choose "
                         "an id they never hold")
    del data
    # The packed layout attends in one block (a loop over key blocks has dynamic bounds,
    # which reverse-mode differentiation cannot take); the parameters are unchanged.
    slots = sum(parallel.kept(length))
    draft = with_attention_blocks(initial.lm, block_size=slots, query_block=slots)
    started = time.perf_counter()
    run = work_dir / f"run_parallel_K{parallel.positions}"
    result = train_parallel(draft, train_arrays, train_config, parallel, frozen=SHARED,
                            batch_size=batch_size, checkpoint_dir=run, heldout=heldout,
                            seed=seed, max_seconds=max_seconds,
                            input_vocab_size=target_config.vocab_size)
    seconds = time.perf_counter() - started
    save_layer_draft(out_dir, result.lm, target_config, layers, vocab,
                     parallel={"mask_id": parallel.mask_id, "positions": parallel.positions})
    metadata_path = out_dir / "metadata.json"
    earlier = json.loads(metadata_path.read_text()) if metadata_path.exists() else {}
    metadata = {"kind": "train-drafter", "method": "pard", "target": "smollm2",
                "layers": [int(i) for i in layers],
                "adapted_from": ("models/checkpoints/smollm2_draft (the shipped layer draft)"
                                 if start.resolve() == SMOLLM2_DRAFT.resolve() else str(start)),
                "steps_done": result.history[-1]["step"] if result.history else 0,
                "train_config": dataclasses.asdict(train_config),
                "parallel_config": dataclasses.asdict(parallel), "batch_size": batch_size,
                "draft_vocab": int(len(vocab)), "target_vocab": target_config.vocab_size,
                "trained_params": int(sum(v.size for v in trained_arrays(result.lm).values())),
                "train_rows": int(len(train_rows)), "heldout_rows": heldout_rows,
                "train_seconds_total": earlier.get("train_seconds_total", 0.0) + seconds}
    return write_run_record(out_dir, metadata, result.history)


def write_parallel_card(out_dir: str | Path, work_dir: str | Path) -> None:
    """MODEL_CARD.md for a parallel draft written by `train_chat_parallel_draft`."""
    out_dir = Path(out_dir)
    metadata = json.loads((out_dir / "metadata.json").read_text())
    settings = json.loads((out_dir / "draft.json").read_text())["parallel"]
    train, cod = metadata["train_config"], metadata["parallel_config"]
    last = metadata.get("last_eval") or {}
    offsets = [key for key in last if key.startswith("acceptance@")]
    table = ["  | offset | acceptance |", "  |---|---|"] + [
        f"  | {key.split('@')[1]} | {last[key]:.3f} |" for key in offsets]
    lines = [
        "# Parallel layer draft (PARD) for SmolLM2-135M-Instruct", "",
        f"- What it is: SmolLM2's distilled layer draft ({len(metadata['layers'])} of the "
        f"target's layers, {metadata['layers']}; `{metadata['adapted_from']}`) adapted into a "
        "`specjax.ParallelDraft`: it reads the committed tokens and then K - 1 mask tokens "
        f"and proposes all K drafts in one forward. Mask token: id {settings['mask_id']} "
        "(`<empty_output>`, a code-corpus special token chat text never holds; its embedding "
        f"row is the target's, frozen). Trained for K <= {settings['positions']}; the "
        f"{metadata['draft_vocab']}-id draft vocabulary, embedding and head rows are the "
        "autoregressive draft's (shared with the target, frozen, not stored).",
        f"- Data: {data_summary(work_dir)}",
        f"- Training (PARD with conditional drop tokens, `specjax.training.parallel`): "
        f"{metadata['steps_done']} steps of batch {metadata['batch_size']} x 256, COD ratio "
        f"{cod['keep_ratio']} (min {cod['min_keep']}), soft labels = the target's top-32 "
        f"probabilities at answer positions, peak LR {train['learning_rate']}, "
        f"{train['warmup_steps']} warmup steps; "
        f"{metadata['train_seconds_total'] / 60:.0f} minutes on {metadata.get('device', '?')}"
        ". Loss curve: `history.jsonl`.",
        "- Command: `" + metadata.get("command", "specjax train-drafter --model smollm2 "
                                      "--method pard") + "` (rerun to resume).",
        f"- Held-out expected acceptance per offset at temperature 1 over the target's top-32 "
        f"mass ({metadata['heldout_rows']} held-out rows, the autoregressive draft's; a lower "
        "bound; offset 1 is the ordinary next-token draft):", "", *table, "",
        f"  Expected accepted drafts of a step of {settings['positions']} drafts under the "
        f"token rule: {last.get('expected_accepted', float('nan')):.2f}.",
        "- Load: `specjax_models.load_parallel_layer_draft(specjax_models.SMOLLM2_PARALLEL, "
        "target)`; CLI: `specjax generate --model smollm2 --drafter parallel`, `specjax chat "
        "--drafter parallel`.",
        "- Decoding speed against the autoregressive draft: "
        "`benchmarks/results/parallel_draft_smollm2_cpu.md`."]
    (out_dir / "MODEL_CARD.md").write_text("\n".join(lines) + "\n")
    copy_data_log(out_dir, work_dir)
