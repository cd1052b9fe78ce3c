"""Load time and peak host memory of `specjax_models.from_pretrained` on a ~1B-parameter random
Llama checkpoint stored in bfloat16 (sharded safetensors), against the size of the
weights. Goal: peak extra memory at most 1.5x the weights.

    python -m benchmarks.machines.load_memory [--dir /tmp/llama_1b_bf16]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import machine_record, write_results

CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 32000,
          "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
          "num_attention_heads": 32, "num_key_value_heads": 8,
          "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
          "tie_word_embeddings": False, "torch_dtype": "bfloat16"}

MEASURE = """
import json, resource, sys, time
import jax, numpy as np
import specjax_models
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS'):
            return int(line.split()[1]) * 1024
base_rss = rss()
start = time.perf_counter()
lm = specjax_models.from_pretrained(sys.argv[1])
jax.block_until_ready(lm.params)
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
weights = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(lm.params))
print(json.dumps({"seconds": seconds, "baseline_rss": base_rss, "peak_rss": peak,
                  "final_rss": rss(), "weights_bytes": weights,
                  "dtypes": sorted({str(x.dtype) for x in jax.tree.leaves(lm.params)})}))
"""


def write_checkpoint(path: Path) -> None:
    """One shard per layer plus one for embeddings/head, written tensor by tensor."""
    import ml_dtypes
    import numpy as np
    from safetensors.numpy import save_file

    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    c = CONFIG
    d, f, h = c["hidden_size"], c["intermediate_size"], c["hidden_size"] // c[
        "num_attention_heads"]
    kv = c["num_key_value_heads"] * h
    rand = lambda *shape: (rng.standard_normal(shape, np.float32) * 0.02).astype(
        ml_dtypes.bfloat16)
    weight_map = {}
    shards = [("model-embed.safetensors", {
        "model.embed_tokens.weight": rand(c["vocab_size"], d),
        "lm_head.weight": rand(c["vocab_size"], d),
        "model.norm.weight": np.ones(d, ml_dtypes.bfloat16)})]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shards.append((f"model-layer{i:02d}.safetensors", {
            p + "input_layernorm.weight": np.ones(d, ml_dtypes.bfloat16),
            p + "post_attention_layernorm.weight": np.ones(d, ml_dtypes.bfloat16),
            p + "self_attn.q_proj.weight": rand(d, d), p + "self_attn.k_proj.weight": rand(kv, d),
            p + "self_attn.v_proj.weight": rand(kv, d), p + "self_attn.o_proj.weight": rand(d, d),
            p + "mlp.gate_proj.weight": rand(f, d), p + "mlp.up_proj.weight": rand(f, d),
            p + "mlp.down_proj.weight": rand(d, f)}))
    for name, tensors in shards:
        save_file(tensors, str(path / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in tensors})
        del tensors
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (path / "config.json").write_text(json.dumps(CONFIG))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/specjax_llama_1b_bf16")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    path = Path(args.dir)
    if not (path / "config.json").exists():
        start = time.perf_counter()
        write_checkpoint(path)
        print(f"wrote {path} in {time.perf_counter() - start:.0f}s", flush=True)
    runs = []
    for _ in range(args.reps):  # fresh processes: peak RSS is per process
        out = subprocess.run([sys.executable, "-c", MEASURE, str(path)], capture_output=True,
                             text=True, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(runs[-1], flush=True)
    best = min(runs, key=lambda r: r["seconds"])
    weights = best["weights_bytes"]
    extra = [(r["peak_rss"] - r["baseline_rss"]) / weights for r in runs]
    disk = sum(p.stat().st_size for p in path.glob("*.safetensors"))
    machine = machine_record()
    payload = {"benchmark": "load_memory", "config": CONFIG, "runs": runs,
               "weights_bytes": weights, "disk_bytes": disk,
               "peak_extra_over_weights": extra, "machine": machine}
    lines = ["# Loading a ~1B-parameter bfloat16 checkpoint with "
             "specjax_models.from_pretrained", "",
             f"Random Llama weights, {weights / 1e9:.2f} GB in memory ({disk / 1e9:.2f} GB of "
             f"sharded safetensors on disk, 17 shards), dtypes kept: {best['dtypes']}. "
             f"{args.reps} fresh processes.", "",
             "| run | load s | peak RSS over baseline (GB) | peak / weights |",
             "|---|---|---|---|"]
    for i, (r, ratio) in enumerate(zip(runs, extra, strict=True)):
        lines.append(f"| {i} | {r['seconds']:.1f} | "
                     f"{(r['peak_rss'] - r['baseline_rss']) / 1e9:.2f} | {ratio:.2f} |")
    lines += ["", f"Goal: peak at most 1.5x the weights: "
              f"{'met' if max(extra) <= 1.5 else 'NOT met'}.",
              f"Command: `{machine['command']}`", ""]
    write_results("load_memory_cpu", payload, "\n".join(lines))


if __name__ == "__main__":
    main()
