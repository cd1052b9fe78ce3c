"""A mixture-of-experts target: greedy decoding against transformers, and its verify cost.

1. Greedy tokens/s of `specjax.generate` against transformers' generate on the same
   random-weight MoE (a Mixtral layout, exported with `save_pretrained`; tokens checked
   identical), batch 1 and 8, median of alternating repetitions, compile apart.
2. v(n): one cached forward of n tokens per row in one-token forwards
   (`specjax.runtime.timing.forward_timer`), for the MoE and for a dense model of the same active
   size (its MLP as wide as the k routed experts together), beside the model
   `specjax.analysis.moe_verify_cost_ratio` (each touched expert read once).
3. KV-cache bytes per token of multi-head latent attention (the cache `init_cache`
   allocates, read from its arrays' shapes) against full keys and values per head, for
   DeepSeek-V2-Lite's and V3's published configurations (bfloat16).

    python -m benchmarks.decoding.moe [--reps 5] [--new-tokens 64] [--batches 1 8]
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
from flax import nnx

import specjax
import specjax_models
from benchmarks.common import (
    command_line,
    greedy_against_transformers,
    machine_record,
    write_results,
)
from specjax import analysis
from specjax.runtime.timing import forward_timer, interleaved_medians

WIDTHS = (1, 2, 3, 5, 9, 17, 33)
# 16 experts of width 512, top 2: the active MLP is 1024 wide, as DENSE's.
MOE = specjax_models.TransformerConfig(
    vocab_size=16_000, num_layers=6, d_model=384, num_heads=6, num_kv_heads=2, d_ff=512,
    max_seq_len=512, num_experts=16, experts_per_token=2, router_normalize=True)
DENSE = dataclasses.replace(MOE, d_ff=1024, num_experts=0, experts_per_token=0,
                            router_normalize=False)


def build(config: specjax_models.TransformerConfig, seed: int = 0):
    model = specjax_models.Transformer(config, rngs=nnx.Rngs(seed))
    return model, specjax.CausalLM.from_nnx(model)


def count_params(config: specjax_models.TransformerConfig) -> int:
    """Parameters of a model of `config`, from its shapes (nothing allocated)."""
    return specjax_models.count_params(specjax_models.transformer.abstract_transformer(config))


def routed_fraction(config: specjax_models.TransformerConfig) -> float:
    """f of analysis.moe_verify_cost_ratio for a model of `config` (bytes of parameters a
    one-token forward reads, the LM head included)."""
    moe_layers = config.num_layers - len(config.dense_layers)
    per_expert = 3 * config.d_model * config.resolved_expert_d_ff * moe_layers
    others = count_params(config) - config.num_experts * per_expert
    return analysis.moe_routed_fraction(others, per_expert, config.experts_per_token)


def decode_rows(args) -> list[dict]:

    from benchmarks.hf_reference import to_transformers

    model, lm = build(MOE)
    hf = to_transformers(model)
    rng = np.random.default_rng(0)
    rows = []
    for batch in args.batches:
        prompts = rng.integers(0, MOE.vocab_size, (batch, args.prompt_len)).astype(np.int32)
        row = greedy_against_transformers(lm, hf, prompts, args.new_tokens, args.reps)
        print(f"decode batch {batch}: ratio {row['ratio']:.2f}, identical "
              f"{row['identical_tokens']}", flush=True)
        rows.append(row)
    return rows


def verify_rows(args, widths=WIDTHS, configs=None) -> list[dict]:
    configs = configs or {"moe": MOE, "dense": DENSE}
    rows = []
    for name, config in configs.items():
        _, lm = build(config)
        timers = {width: forward_timer(lm, 1, width, cache_slots=128, position=64,
                                       steps=args.steps) for width in widths}
        seconds = interleaved_medians(timers, args.reps)
        for width in widths:
            row = {"model": name, "tokens": width, "ms": 1e3 * seconds[width],
                   "steps": seconds[width] / seconds[widths[0]]}
            if config.num_experts:
                row["model_steps"] = float(analysis.moe_verify_cost_ratio(
                    width, config.experts_per_token, config.num_experts,
                    routed_fraction(config)))
                row["pairs"] = width * config.experts_per_token
            rows.append(row)
        print(f"v(n) {name}: " + ", ".join(f"{w}:{seconds[w] / seconds[widths[0]]:.2f}"
                                           for w in widths), flush=True)
    return rows


# The attention fields of published configurations (config.json).
LATENT_ATTENTION = {
    "DeepSeek-V2-Lite": dict(num_layers=27, num_heads=16, kv_lora_rank=512, q_lora_rank=0,
                             qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
    "DeepSeek-V3": dict(num_layers=61, num_heads=128, kv_lora_rank=512, q_lora_rank=1536,
                        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
}


def cache_rows() -> list[dict]:
    """Bytes per token of the latent cache (from the shapes `KVCache.create` gives, not
    allocated) and of full per-head keys and values, bfloat16."""
    import jax

    rows = []
    for name, fields in LATENT_ATTENTION.items():
        config = specjax_models.TransformerConfig(
            vocab_size=1024, d_model=1024, d_ff=1024, max_seq_len=64, num_kv_heads=fields[
                "num_heads"], dtype="bfloat16", param_dtype="bfloat16", **fields)
        cache = jax.eval_shape(lambda config=config: specjax_models.KVCache.create(config, 1, 1))
        latent = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves((cache.keys,
                                                                          cache.values)))
        heads = fields["num_heads"]
        full = fields["num_layers"] * heads * 2 * (
            fields["qk_nope_head_dim"] + fields["qk_rope_head_dim"] + fields["v_head_dim"])
        rows.append({"model": name, "latent_bytes": latent, "full_bytes": full,
                     "ratio": full / latent})
        print(f"cache {name}: {latent} bytes per token against {full}", flush=True)
    return rows


def markdown(payload: dict) -> str:
    machine = payload["machine"]
    lines = ["# A mixture-of-experts target on CPU", "",
             f"Machine: {machine.get('cpu_model') or machine['processor']}, "
             f"{machine['cpu_count']} CPUs, jax "
             f"{machine['jax']} ({machine['jax_backend']}).",
             f"MoE: {payload['moe_params'] / 1e6:.1f}M parameters, 16 experts, top 2 "
             f"(Mixtral layout); dense: {payload['dense_params'] / 1e6:.1f}M, the same "
             "active size. Random weights, float32.", ""]
    if payload["decode"]:
        lines += ["## Greedy decoding against transformers (same weights)", "",
                  "| batch | specjax tok/s | transformers tok/s | ratio | identical tokens "
                  "| first call (s) |", "|---|---|---|---|---|---|"]
        for r in payload["decode"]:
            lines.append(f"| {r['batch']} | {r['specjax_tokens_per_s']:.0f} | "
                         f"{r['transformers_tokens_per_s']:.0f} | {r['ratio']:.2f} | "
                         f"{r['identical_tokens']} | "
                         f"{r['specjax_first_call_s_incl_compile']:.1f} |")
        lines.append("")
    if payload["verify"]:
        moe = {r["tokens"]: r for r in payload["verify"] if r["model"] == "moe"}
        dense = {r["tokens"]: r for r in payload["verify"] if r["model"] == "dense"}
        lines += ["## v(n): an n-token cached forward in one-token forwards", "",
                  "| n | token-expert pairs | MoE ms | MoE v(n) | model v(n) | dense ms | "
                  "dense v(n) |", "|---|---|---|---|---|---|---|"]
        for n in sorted(moe):
            m, d = moe[n], dense.get(n, {})
            lines.append(f"| {n} | {m['pairs']} | {m['ms']:.2f} | {m['steps']:.2f} | "
                         f"{m['model_steps']:.2f} | {d.get('ms', float('nan')):.2f} | "
                         f"{d.get('steps', float('nan')):.2f} |")
        lines += ["", "Each forward's tokens differ by row and position, as drafts do "
                  "(`specjax.runtime.timing.forward_timer`), so they route to different experts. "
                  "The model counts each touched expert read once. On CPU the layer "
                  "runs the tiled dispatch (`specjax_models.feed_forward`: pairs sorted "
                  "by expert, tiles of about 1.5 mean loads), so a touched expert is "
                  "mostly read once, as the model assumes, but XLA copies its weights "
                  "out of the stacked array before multiplying (a second read and a "
                  "write); GPU and TPU run `ragged_dot`.", ""]
    if payload.get("cache"):
        lines += ["## KV cache per token: latent attention against full keys and values",
                  "", "| configuration | latent cache (bytes/token) | full K/V (bytes/token) "
                  "| ratio |", "|---|---|---|---|"]
        for r in payload["cache"]:
            lines.append(f"| {r['model']} | {r['latent_bytes']:,} | {r['full_bytes']:,} | "
                         f"{r['ratio']:.1f}x |")
        lines += ["", "bfloat16, every layer: the latent cache holds kv_lora_rank + "
                  "qk_rope_head_dim numbers per token and layer "
                  "(`specjax_models.latent_attention`); full K/V would hold heads x "
                  "(qk_nope + qk_rope + v_head_dim).", ""]
    lines += [f"Command: `{payload['command']}`", ""]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--skip-decode", action="store_true")
    args = parser.parse_args()
    payload = {"benchmark": "moe", "machine": machine_record(), "command": command_line(),
               "moe_params": count_params(MOE), "dense_params": count_params(DENSE),
               "decode": [], "verify": [], "cache": cache_rows()}
    payload["verify"] = verify_rows(args)
    if not args.skip_decode:
        payload["decode"] = decode_rows(args)
    write_results("moe_cpu", payload, markdown(payload))


if __name__ == "__main__":
    main()
