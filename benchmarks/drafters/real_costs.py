"""What one speculative step costs on SmolLM2-135M-Instruct, in one-token target steps:
the target's verify forward at each width (K + 1 tokens), one forward of the shipped
EAGLE-3 head (block + logits over its draft vocabulary) and one of the shipped distilled
2-layer draft (over its draft vocabulary). Batch 1, a 320-token context in
the cache, float32, compile excluded, median of `--reps` calls; the weights are passed as
arguments (not compiled in as constants). Explains `real_head_cpu.md`: a chain of K
breaks even when tau exceeds verify(K + 1) + K * head.

    python -m benchmarks.drafters.real_costs [--reps 30] [--name real_costs_cpu]

The XLA flags in force (`XLA_FLAGS`, e.g. another CPU matmul library) are recorded.
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np

import specjax_models
from benchmarks.common import machine_record, write_results
from specjax.runtime.timing import wall_seconds
from specjax_models import SMOLLM2_HEAD
from specjax_models.heads import load_head_for

CONTEXT = 320


def median_ms(fn, args, reps: int) -> float:
    jax.block_until_ready(fn(*args))  # compile
    return 1e3 * float(np.median([wall_seconds(lambda: jax.block_until_ready(fn(*args)))[1]
                                  for _ in range(reps)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--name", default="real_costs_cpu")
    args = parser.parse_args()
    path = specjax_models.smollm2_path()
    target = specjax_models.from_gguf(path)
    head = load_head_for(SMOLLM2_HEAD, target)
    cache = target.init_cache(1, CONTEXT + 64)

    @jax.jit
    def verify(params, tokens, cache):
        width = tokens.shape[1]
        positions = CONTEXT + jnp.arange(width, dtype=jnp.int32)[None]
        return target.with_params(params).apply(tokens, positions, cache,
                                                jnp.full((1,), CONTEXT, jnp.int32))[0]

    rows = []
    one = None
    for width in (1, 2, 3, 4, 6, 8):
        ms = median_ms(verify, (target.params, jnp.ones((1, width), jnp.int32), cache),
                       args.reps)
        one = one or ms
        rows.append({"what": f"target forward, {width} token(s)", "ms": ms, "steps": ms / one})

    slots = CONTEXT + 64
    keys = jnp.zeros((1, slots, head.config.num_kv_heads, head.config.resolved_head_dim))

    @jax.jit
    def head_forward(drafter, token, feature, keys, values):
        position = jnp.full((1, 1), CONTEXT, jnp.int32)
        out, _ = drafter._block(token, feature, position, (keys, values), position[:, 0])
        return drafter._logits(out)

    ms = median_ms(head_forward, (head, jnp.ones((1, 1), jnp.int32),
                                  jnp.ones((1, 1, head.config.d_model)), keys, keys), args.reps)
    rows.append({"what": "EAGLE-3 head forward + logits (draft vocabulary "
                         f"{head.lm_head.shape[0]})", "ms": ms, "steps": ms / one})
    from specjax_models import SMOLLM2_DRAFT, load_layer_draft

    draft = load_layer_draft(SMOLLM2_DRAFT, target).lm
    draft_cache = draft.init_cache(1, CONTEXT + 64)

    @jax.jit
    def draft_forward(params, token, cache):
        position = jnp.full((1, 1), CONTEXT, jnp.int32)
        return draft.with_params(params).apply(token, position, cache, position[:, 0])[0]

    ms = median_ms(draft_forward, (draft.params, jnp.ones((1, 1), jnp.int32), draft_cache),
                   args.reps)
    rows.append({"what": f"distilled 2-layer draft forward + logits (draft vocabulary "
                         f"{draft.vocab_size})", "ms": ms, "steps": ms / one})
    flags = os.environ.get("XLA_FLAGS", "")
    name = "" if args.name == "real_costs_cpu" else f" --name {args.name}"
    lines = ["# The cost of a speculative step on SmolLM2-135M-Instruct", "",
             (f"`XLA_FLAGS={flags} " if flags else "`")
             + f"python -m benchmarks.drafters.real_costs --reps {args.reps}{name}`: batch 1, "
             f"{CONTEXT} tokens of context, float32, compile excluded, median; `steps` = "
             "one-token target forwards.", "", "| what | ms | steps |", "|---|---|---|"]
    lines += [f"| {r['what']} | {r['ms']:.2f} | {r['steps']:.2f} |" for r in rows]
    verify4 = next(r["steps"] for r in rows if r["what"].startswith("target forward, 4"))
    head_steps = next(r["steps"] for r in rows if r["what"].startswith("EAGLE-3"))
    lines += ["", f"A chain of K = 3 costs verify(4) + 3 head forwards = "
              f"{verify4 + 3 * head_steps:.2f} steps: it breaks even at tau = "
              f"{verify4 + 3 * head_steps:.2f} and reaches 2x at tau = "
              f"{2 * (verify4 + 3 * head_steps):.2f} (at most 4)."]
    write_results(args.name, {"benchmark": "real_costs", "machine": machine_record(),
                               "xla_flags": flags, "args": vars(args), "rows": rows},
                  "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
