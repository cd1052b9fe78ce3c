"""Loading published drafters: `specjax_models.load_drafter` time and peak host memory per
layout, on random checkpoints of the published heads' real shapes (bfloat16 safetensors, as
the downloads are), each in a fresh process.

Shapes: EAGLE-3 for Llama-3.1-8B-Instruct (width 4096, draft vocabulary 32,000 of 128,256),
in the authors' and the `speculators` layout; EAGLE-1 and Medusa-1 (5 heads) for
Vicuna-7B (width 4096, vocabulary 32,000); MiMo-7B's MTP module (width 4096, vocabulary
151,680). The target each loads onto has the real width, vocabulary and depth-dependent
feature layers but one narrow head and MLP per block (the drafter reads only its
embedding, LM head and depth), so that it fits beside the drafter on a 24 GB machine.
"Weights" is the memory the drafter holds beyond the target's (its own LM head included;
the target's embedding is shared; an untied target LM head it scores through is a [V, D]
copy). Peak memory is the process's high-water mark while loading (reset after the target
is built and what it freed is returned: `malloc_trim`, Linux `/proc/self/clear_refs`),
over its resident memory before.

    python -m benchmarks.drafters.published_drafters [--dir /tmp/specjax_published] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import machine_record, median, write_results

# layout -> (synthetic shape fields, target width/vocabulary/depth, what it stands for)
CASES = {
    "eagle3": (dict(d_model=4096, vocab_size=128256, num_layers=32, num_heads=32,
                    num_kv_heads=8, d_ff=14336, draft_vocab_size=32000),
               "EAGLE-3 for Llama-3.1-8B-Instruct, the authors' layout"),
    "eagle3-speculators": (dict(d_model=4096, vocab_size=128256, num_layers=32, num_heads=32,
                                num_kv_heads=8, d_ff=14336, draft_vocab_size=32000),
                           "EAGLE-3 for Llama-3.1-8B-Instruct, speculators layout"),
    "eagle1": (dict(d_model=4096, vocab_size=32000, num_layers=32, num_heads=32,
                    num_kv_heads=32, d_ff=11008),
               "EAGLE-1 for Vicuna-7B"),
    "medusa1": (dict(d_model=4096, vocab_size=32000, num_layers=32, medusa_heads=5,
                     medusa_layers=1),
                "Medusa-1 (5 heads) for Vicuna-7B"),
    "mimo-mtp": (dict(d_model=4096, vocab_size=151680, num_layers=36, num_heads=32,
                      num_kv_heads=8, d_ff=11008),
                 "MiMo-7B's MTP module"),
}

MEASURE = """
import json, sys, time
import jax, numpy as np
from flax import nnx
import specjax, specjax_models
def status(key):
    for line in open('/proc/self/status'):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
shape = json.loads(sys.argv[2])
config = specjax_models.TransformerConfig(
    vocab_size=shape['vocab_size'], num_layers=shape['num_layers'], d_model=shape['d_model'],
    num_heads=1, num_kv_heads=1, head_dim=8, d_ff=8, max_seq_len=256, dtype='bfloat16',
    param_dtype='bfloat16')
target = specjax.CausalLM.from_nnx(specjax_models.Transformer(config, rngs=nnx.Rngs(0)))
jax.block_until_ready(target.params)
import ctypes, gc
gc.collect()
ctypes.CDLL('libc.so.6').malloc_trim(0)  # what building the target freed goes back first
open('/proc/self/clear_refs', 'w').write('5')  # the high-water mark starts here
base = status('VmRSS')
start = time.perf_counter()
drafter = specjax_models.load_drafter(sys.argv[1], target, dtype=sys.argv[3])
jax.block_until_ready(drafter)
seconds = time.perf_counter() - start
# The drafter's own device memory: every array it holds but the target's (its embedding
# is shared; an untied target LM head it scores through is a [V, D] copy, counted).
shared = {x.unsafe_buffer_pointer() for x in jax.tree.leaves(target.params)}
weights = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(drafter)
              if x.unsafe_buffer_pointer() not in shared)
print(json.dumps({"seconds": seconds, "baseline_rss": base, "peak_rss": status('VmHWM'),
                  "weights_bytes": weights, "drafter": type(drafter).__name__}))
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/specjax_published")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--layouts", default=",".join(CASES))
    args = parser.parse_args()
    import ml_dtypes

    from specjax_models.published_layouts import SyntheticShape, write_synthetic_drafter

    rows, payload = [], {"benchmark": "published_drafters", "cases": {}}
    for layout in args.layouts.split(","):
        fields, label = CASES[layout]
        directory = Path(args.dir) / layout
        if not (directory / "config.json").exists():
            start = time.perf_counter()
            write_synthetic_drafter(directory, layout, SyntheticShape(**fields),
                                    dtype=ml_dtypes.bfloat16)
            print(f"wrote {directory} in {time.perf_counter() - start:.0f} s", flush=True)
        disk = sum(p.stat().st_size for p in directory.glob("*.safetensors"))
        for dtype in ("float32", "bfloat16"):
            runs = []
            for _ in range(args.reps):  # fresh processes: the high-water mark is per process
                out = subprocess.run([sys.executable, "-c", MEASURE, str(directory),
                                      json.dumps(fields), dtype], capture_output=True,
                                     text=True, check=True)
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
                print(layout, dtype, runs[-1], flush=True)
            seconds = median([r["seconds"] for r in runs])
            peak = median([r["peak_rss"] - r["baseline_rss"] for r in runs])
            weights = runs[0]["weights_bytes"]
            payload["cases"][f"{layout}/{dtype}"] = {"label": label, "shape": fields,
                                                     "disk_bytes": disk, "runs": runs}
            rows.append(f"| {label} | {dtype} | {disk / 1e9:.2f} | {weights / 1e9:.2f} | "
                        f"{seconds:.1f} | {peak / 1e9:.2f} | {peak / weights:.2f} |")
    machine = machine_record()
    payload["machine"] = machine
    lines = ["# Loading published drafters (specjax_models.load_drafter)", "",
             f"Random weights in each published layout at the real heads' shapes, stored in "
             f"bfloat16 safetensors; medians of {args.reps} fresh processes on "
             f"{machine['cpu_model'] or 'this CPU'} ({machine['cpu_count']} cores). "
             "Weights: what the drafter holds beyond the target's arrays (its own LM head "
             "included; an untied target LM head it scores through is a [V, D] copy). "
             "Peak: the process's high-water mark while loading, over its resident memory "
             "before (the target already built).", "",
             "| drafter | loaded as | file GB | weights GB | load s | peak extra GB | "
             "peak / weights |", "|---|---|---|---|---|---|---|", *rows, "",
             f"Command: `{machine['command']}`", ""]
    write_results("published_drafters_cpu", payload, "\n".join(lines))


if __name__ == "__main__":
    main()
