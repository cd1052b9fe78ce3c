"""SmolLM2's retrieval datastore: the model's own greedy answers, for `Retrieval` drafting.

The target answers `chat_prompts` (questions, writing, code) through its chat template,
greedily, then rewrite prompts that quote the first answers (`rewrite_prompts`); each
answer (up to and including its end-of-turn token) is one document of the datastore.
None of `benchmarks/real_prompts.py`, the evaluation set, is among the prompts
(`tests/test_smollm2_datastore.py` checks). Resumable: answers are cached per chunk in a
work directory, and a rerun skips the chunks on disk.

    python -m specjax_models.recipes.smollm2_datastore WORK_DIR [--out FILE]
        [--chat 512] [--rewrite 128] [--new-tokens 192] [--batch 16]

installs `models/checkpoints/smollm2_datastore.npz` by default (`SMOLLM2_DATASTORE`).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import specjax
from specjax.drafters.datastore import Datastore
from specjax.runtime.files import load_npz, save_npz_atomically
from specjax_models.recipes.smollm2_prompts import chat_prompts, rewrite_prompts

CHUNK = "answers_{stage}_{index:04d}.npz"


def answer_chunk(target, tokenizer, prompts: list[str], new_tokens: int) -> list[np.ndarray]:
    """The target's greedy answer to each prompt, cut after its first end-of-turn token."""
    encoded = [tokenizer.apply_chat_template([{"role": "user", "content": p}])
               for p in prompts]
    out = specjax.generate(target, encoded, max_new_tokens=new_tokens, sampling=specjax.GREEDY,
                           eos_id=tokenizer.eos_ids)
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    return [tokens[row, :lengths[row]].astype(np.int32) for row in range(len(prompts))]


def answers(target, tokenizer, work_dir: Path, stage: str, prompts: list[str],
            new_tokens: int, batch: int) -> list[np.ndarray]:
    """Every prompt's answer, from the chunk files of `work_dir` or generated (and kept)."""
    found = []
    for index in range(0, len(prompts), batch):
        path = work_dir / CHUNK.format(stage=stage, index=index // batch)
        if path.exists():
            arrays = load_npz(path, "delete it; the rerun generates it again")
            flat, lengths = arrays["tokens"], arrays["lengths"]
            found += np.split(flat, np.cumsum(lengths)[:-1])
            continue
        started = time.perf_counter()
        chunk = answer_chunk(target, tokenizer, prompts[index:index + batch], new_tokens)
        save_npz_atomically(path, tokens=np.concatenate(chunk),
                            lengths=np.array([len(a) for a in chunk], np.int64))
        print(f"{stage} {index + len(chunk)}/{len(prompts)} "
              f"({time.perf_counter() - started:.1f} s)", flush=True)
        found += chunk
    return found


def build(work_dir: str | Path, out: str | Path, *, chat: int = 512, rewrite: int = 128,
          new_tokens: int = 192, batch: int = 16, quote_tokens: int = 100) -> Datastore:
    """Generate (or reuse) the answers and save their datastore at `out`."""
    import specjax_models

    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    path = specjax_models.smollm2_path()
    target = specjax_models.from_gguf(path)
    tokenizer = specjax_models.gguf_tokenizer(path)
    first = answers(target, tokenizer, work_dir, "chat", chat_prompts(chat), new_tokens, batch)
    eos = set(tokenizer.eos_ids)
    quoted = [tokenizer.decode([t for t in answer[:quote_tokens] if t not in eos])
              for answer in first[:rewrite]]
    second = answers(target, tokenizer, work_dir, "rewrite", rewrite_prompts(quoted),
                     new_tokens, batch)
    datastore = Datastore.build(first + second, target.vocab_size)
    datastore.save(out)
    print(f"{out}: {datastore.num_documents} answers, {datastore.num_tokens} tokens")
    return datastore


def main(argv=None) -> None:
    from specjax_models.bundled import SMOLLM2_DATASTORE

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work_dir")
    parser.add_argument("--out", default=str(SMOLLM2_DATASTORE))
    parser.add_argument("--chat", type=int, default=512)
    parser.add_argument("--rewrite", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=192)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args(argv)
    build(args.work_dir, args.out, chat=args.chat, rewrite=args.rewrite,
          new_tokens=args.new_tokens, batch=args.batch)


if __name__ == "__main__":
    main()
