"""Decoding on a mesh of 8 virtual CPU devices against one device, on the same machine.

- A random Llama-style model with 8 heads (so every mesh divides it): plain greedy
  decoding of a batch of 8 and speculative decoding with a one-layer draft (K = 4),
  on 1 device and on meshes 8x1 (data), 1x8 (model) and 2x4, medians of alternating
  repetitions, compile apart; the collectives in the compiled one-token forward (count and
  bytes moved per device, read from the HLO).
- SmolLM2 loaded from its GGUF file onto a model axis of 3 (9 heads, 3 KV heads: the
  divisors it has) and on one device: peak resident memory of each fresh process.

Virtual CPU devices share the same cores, so a mesh cannot be faster here: what this
measures is the sharding path's overhead and its collectives, not a speed-up.

    python -m benchmarks.decoding.sharding --reps 5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from benchmarks.common import alternating_times, command_line, cpu_model, median, write_results

NAME = "sharding_cpu"
MESHES = ("one device", "data=8", "model=8", "data=2,model=4")

LOAD = """
import resource, sys, time, jax
jax.config.update("jax_num_cpu_devices", 3)
import specjax, specjax_models
from specjax.runtime.sharding import mesh_from_spec
start = time.perf_counter()
mesh = None if sys.argv[1] == "one device" else mesh_from_spec(sys.argv[1])
lm = specjax_models.from_gguf(specjax_models.smollm2_path(), cache=False, mesh=mesh)
jax.block_until_ready(lm.params)
print("LOAD", time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def decoding(reps: int) -> tuple[dict, dict]:
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    from flax import nnx

    import specjax
    import specjax_models
    import specjax_models.sharded
    from specjax.runtime.sharding import default_rules, mesh_from_spec

    def model(layers: int, seed: int):
        config = specjax_models.TransformerConfig(
            vocab_size=8192, num_layers=layers, d_model=512, num_heads=8, num_kv_heads=8,
            d_ff=1536, max_seq_len=512)
        return specjax.CausalLM.from_nnx(specjax_models.Transformer(config,
                                                                    rngs=nnx.Rngs(seed)))

    target, draft = model(6, 0), model(1, 1)
    prompts = [[1 + (13 * r + i) % 8000 for i in range(24)] for r in range(8)]
    greedy = dict(max_new_tokens=48, sampling=specjax.GREEDY)
    calls, compiled, hlo = {}, {}, {}
    for name in MESHES:
        if name == "one device":
            lm = target
        else:
            mesh = mesh_from_spec(name)
            lm = specjax_models.shard(target, mesh, default_rules(mesh))
        plain = lambda lm=lm: specjax.generate(lm, prompts, **greedy).tokens
        spec = lambda lm=lm: specjax.speculative_generate(lm, draft, prompts,
                                                          num_draft_tokens=4, **greedy).tokens
        compiled[name] = {"plain": alternating_times({"c": plain}, 1)["c"][0],
                          "speculative": alternating_times({"c": spec}, 1)["c"][0]}
        calls[f"plain, {name}"] = plain
        calls[f"speculative, {name}"] = spec
        hlo[name] = specjax_models.sharded.forward_collectives(lm, 8, 128)
    times = alternating_times(calls, reps)
    return {name: median(values) for name, values in times.items()}, {
        "compile_seconds": compiled, "collectives": hlo}


def loading() -> dict:
    peaks = {}
    for name in ("one device", "model=3"):
        done = subprocess.run([sys.executable, "-c", LOAD, name], capture_output=True,
                              text=True, check=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
        line = next(line for line in done.stdout.splitlines() if line.startswith("LOAD"))
        seconds, peak_kb = line.split()[1:]
        peaks[name] = {"seconds": float(seconds), "peak_rss_mb": int(peak_kb) / 1024}
    return peaks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    load = loading()
    seconds, extra = decoding(args.reps)
    lines = [f"# Decoding on 8 virtual CPU devices ({cpu_model() or 'unknown CPU'}, "
             f"{os.cpu_count()} cores)", "", f"`{command_line()}`: a random 6-layer model "
             "(d_model 512, 8 heads, vocabulary 8192), batch 8, 48 new tokens, greedy; "
             "speculative with a random 1-layer draft, K = 4; medians of "
             f"{args.reps} alternating repetitions, compile apart. The virtual devices "
             "share the machine's cores: a mesh cannot be faster here.", "",
             "| mesh | plain s | vs one device | speculative s | vs one device | "
             "collectives per one-token forward (count, KiB per device) |",
             "|---|---|---|---|---|---|"]
    for name in MESHES:
        plain, spec = seconds[f"plain, {name}"], seconds[f"speculative, {name}"]
        found = extra["collectives"][name]
        described = ", ".join(f"{op} {v['count']} ({v['bytes'] / 1024:.0f} KiB)"
                              for op, v in found.items()) or "none"
        lines.append(f"| {name} | {plain:.3f} | "
                     f"{plain / seconds['plain, one device']:.2f}x | {spec:.3f} | "
                     f"{spec / seconds['speculative, one device']:.2f}x | {described} |")
    lines += ["", "SmolLM2 (GGUF Q4_1) loaded without the model cache, fresh processes:", "",
              "| placement | seconds | peak resident MiB |", "|---|---|---|"]
    lines += [f"| {name} | {v['seconds']:.2f} | {v['peak_rss_mb']:.0f} |"
              for name, v in load.items()]
    markdown = "\n".join(lines) + "\n"
    print(markdown)
    write_results(NAME, {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
                         "command": command_line(), "seconds": seconds, "loading": load,
                         **json.loads(json.dumps(extra))}, markdown)


if __name__ == "__main__":
    main()
