"""DeepSeek-V3's MTP module as the drafter, on a random DeepSeek-V3-layout checkpoint: its
cost and its exactness.

transformers writes a DeepSeek-V3 checkpoint of random weights (latent attention, a dense
first layer then experts with DeepSeek's grouped sigmoid router and a shared expert,
YaRN); `specjax_models.published_layouts.add_deepseek_mtp_module` adds the MTP module
in the published layout (`model.layers.{L}.*`), and `from_pretrained(dir, mtp=True)` loads
both. The module's weights are random, so its drafts are noise and tau says nothing about
a trained one (DeepSeek reports 85-90% acceptance of its second token): what this measures
is the cost of drafting with it, in the step's own units (`specjax.bench`: c = one step's
whole draft block, v = the verify forward, both in one-token target forwards, the ideal
tau / (K c + v) beside the speed reached), the cache it adds per token against the
target's, and that speculative decoding with it gives plain decoding's tokens (greedy,
every prompt).

    python -m benchmarks.decoding.deepseek_mtp [--reps 3] [--new-tokens 32] [--prompts 6]
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np

import specjax_models
from benchmarks.common import command_line, machine_record, write_results
from specjax import bench
from specjax.bench.prompts import BenchPrompt
from specjax.drafters import DraftModel

# A DeepSeek-V3 layout at CPU size: 4 layers (the first dense), 16 experts of which 2
# are routed per token (top 2 of 4 groups limited to 2) plus one shared, latent attention
# with a q latent.
CONFIG = dict(vocab_size=8000, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
              num_attention_heads=8, num_key_value_heads=8, kv_lora_rank=128, q_lora_rank=192,
              qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
              moe_intermediate_size=256, n_routed_experts=16, n_shared_experts=1,
              num_experts_per_tok=2, n_group=4, topk_group=2, first_k_dense_replace=1,
              max_position_embeddings=4096, rope_parameters={
                  "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                  "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 10_000.0})


def write_checkpoint(directory) -> None:
    import torch
    import transformers

    from specjax_models.published_layouts import add_deepseek_mtp_module

    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**CONFIG))
    with torch.no_grad():  # the correction bias is a zero buffer: give it a say
        for layer in model.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.normal_(0.0, 0.3)
    model.save_pretrained(directory)
    add_deepseek_mtp_module(directory, seed=1, scale=0.02)


def cache_bytes_per_token(cache) -> int:
    """Bytes per cached token of a KVCache (every layer's arrays, positions apart)."""
    arrays = list(cache.keys) + list(cache.values)
    return sum(a.dtype.itemsize * a.size // a.shape[2] // a.shape[0] for a in arrays)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--prompt-len", type=int, default=48)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as directory:
        write_checkpoint(directory)
        target, mtp = specjax_models.from_pretrained(directory, mtp=True)
    mtp = mtp.with_method("greedy")
    first_layer = specjax_models.first_layers(target, 1)
    rng = np.random.default_rng(0)
    prompts = [BenchPrompt(tuple(int(t) for t in rng.integers(0, CONFIG["vocab_size"],
                                                              args.prompt_len)),
                           name=str(i)) for i in range(args.prompts)]
    methods = [bench.BenchMethod(f"deepseek mtp, K={k}", mtp, k) for k in (1, 2, 3)]
    # A reference drafter of the same kind of cost: the target's own first layer (a
    # draft model: one MLA layer, dense, plus the embedding and LM head).
    methods.append(bench.BenchMethod("first target layer as draft, K=3",
                                     DraftModel(first_layer, "greedy"), 3))
    report = bench.run(target, methods, prompts, max_new_tokens=args.new_tokens,
                       reps=args.reps, progress=lambda done, total, _: print(
                           f"unit {done}/{total}", flush=True))
    target_cache = target.init_cache(1, 64)
    mtp_cache = mtp.block.init_cache(1, 64)
    payload = {"benchmark": "deepseek_mtp", "machine": machine_record(),
               "command": command_line(), "config": CONFIG,
               "target_params": int(sum(x.size for x in _leaves(target.params))),
               "mtp_block_params": int(sum(x.size for x in _leaves(mtp.block.params))),
               "target_cache_bytes_per_token": cache_bytes_per_token(target_cache),
               "mtp_cache_bytes_per_token": cache_bytes_per_token(mtp_cache),
               "report": report.as_dict(), "exact": report.ok}
    write_results("deepseek_mtp_cpu", payload, markdown(payload, report))
    if not report.ok:
        raise SystemExit("speculative decoding with the MTP module left plain decoding's "
                         "tokens: see the failures above")


def _leaves(tree):
    import jax

    return jax.tree.leaves(tree)


def markdown(payload: dict, report) -> str:
    machine = payload["machine"]
    return "\n".join([
        "# DeepSeek-V3's MTP module as the drafter (random DeepSeek-V3-layout checkpoint)",
        "",
        f"Machine: {machine.get('cpu_model')} ({machine['cpu_count']} cores), jax "
        f"{machine['jax']} on {machine['jax_backend']}; commit {machine.get('git_commit')}.",
        f"Command: `{payload['command']}`",
        "",
        f"Target: {payload['target_params']:,} parameters (DeepSeek-V3 layout: "
        f"{CONFIG['num_hidden_layers']} layers, latent attention, "
        f"{CONFIG['n_routed_experts']} experts top {CONFIG['num_experts_per_tok']} plus "
        f"a shared one, YaRN); the MTP module's block: {payload['mtp_block_params']:,} "
        "parameters (one more such layer) plus its projection and norms, reading the "
        "target's embedding and LM head copies.",
        f"KV cache per token: target {payload['target_cache_bytes_per_token']:,} B "
        f"(float32 latents of {CONFIG['num_hidden_layers']} layers), the MTP module "
        f"{payload['mtp_cache_bytes_per_token']:,} B (one layer's latent and rotary key).",
        "",
        "Random weights: the module's drafts are noise, so tau and the speedup say nothing "
        "about a trained module. The columns that do: c (a step's draft block in one-token "
        "target forwards), v (the verify forward), the ideal tau / (K c + v) at the "
        "measured tau, and `exact` (greedy tokens identical to plain decoding on every "
        "prompt). The target's own first layer as a draft model, K = 3, is the "
        "reference cost of a one-layer drafter.",
        "",
        report.to_markdown(),
        "",
    ])


if __name__ == "__main__":
    main()
