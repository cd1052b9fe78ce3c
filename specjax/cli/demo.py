"""`specjax demo`: the bundled byte-level pair (trained on the Python standard library)
continues held-out code with speculative decoding, streaming the text as it is accepted
(accepted draft tokens and target tokens in different colours), then measures the
speedup over plain decoding of the same target in the same run and says in numbers why
it is what it is."""

from __future__ import annotations

from specjax.cli.common import (
    DIM,
    DRAFT_COLOUR,
    PROMPT_END_MARKER,
    TARGET_COLOUR,
    add_colour_option,
    num_params,
    painter,
    say,
    seed_value,
    stream_text,
    use_colour,
)
from specjax.cli.loading import load_model


def register(sub) -> None:
    """Add the `demo` command's parser to the `specjax` subparsers."""
    demo = sub.add_parser("demo", help="the bundled pair continues held-out code, streamed "
                          "and coloured, then the speedup over plain decoding and why",
                          description="The bundled byte-level pair continues held-out "
                          "Python code with speculative decoding (a draft model, then "
                          "prompt lookup), then measures speculative against plain "
                          "decoding in the same run and explains the figures.")
    demo.add_argument("--max-new-tokens", type=int, default=160,
                      help="tokens generated per prompt (default: %(default)s)")
    demo.add_argument("--num-draft-tokens", type=int, default=8,
                      help="K, drafts verified per target forward (default: %(default)s)")
    demo.add_argument("--temperature", type=float, default=0.0,
                      help="0 is greedy (default: %(default)s)")
    demo.add_argument("--prompts", type=int, default=2,
                      help="held-out prompts to continue (default: %(default)s)")
    demo.add_argument("--reps", type=int, default=3,
                      help="timed repetitions; medians are reported (default: %(default)s)")
    demo.add_argument("--seed", type=seed_value, default=0, help="PRNG seed (default: %(default)s)")
    add_colour_option(demo)
    demo.set_defaults(handler=run)


def _demo_tree():
    import specjax

    return specjax.DynamicTree(num_nodes=32, max_depth=8, top_k=4)


def _timed_pair(spec, plain, reps: int):
    """Median seconds of two decoder calls, alternated (these machines are noisy)."""
    import numpy as np

    from specjax.runtime.timing import wall_seconds

    spec_out, plain_out = spec(), plain()  # compile (shapes are bucketed: once)
    spec_times, plain_times = [], []
    for _ in range(reps):
        spec_out, seconds = wall_seconds(spec)
        spec_times.append(seconds)
        plain_out, seconds = wall_seconds(plain)
        plain_times.append(seconds)
    return spec_out, plain_out, float(np.median(spec_times)), float(np.median(plain_times))


def _demo_speed(target, draft, prompt_ids, args, sampling, key) -> None:
    """Speedup of speculative over plain decoding, measured here, and why it is what it is:
    the decode phase (time after the first token) and end to end, then tau, c and v."""
    import numpy as np

    import specjax
    from specjax.decoding.inputs import plan_capacity
    from specjax.runtime.timing import step_costs

    k = args.num_draft_tokens
    lengths = np.array([len(ids) for ids in prompt_ids])
    capacity = plan_capacity(lengths, args.max_new_tokens, target.max_seq_len,
                             extra_slots=k + 1)
    spec_run = lambda ids, n: lambda: specjax.speculative_generate(
        target, draft, [ids], max_new_tokens=n, num_draft_tokens=k, sampling=sampling,
        key=key, cache_size=capacity)
    plain_run = lambda ids, n: lambda: specjax.generate(
        target, [ids], max_new_tokens=n, sampling=sampling, key=key, cache_size=capacity)
    totals = {"spec": 0.0, "plain": 0.0, "spec_first": 0.0, "plain_first": 0.0}
    runs, first_tokens = [], 0
    for ids in prompt_ids:
        out, _, spec_s, plain_s = _timed_pair(spec_run(ids, args.max_new_tokens),
                                              plain_run(ids, args.max_new_tokens), args.reps)
        first, _, spec_first_s, plain_first_s = _timed_pair(spec_run(ids, 1), plain_run(ids, 1),
                                                            args.reps)
        totals["spec"] += spec_s
        totals["plain"] += plain_s
        totals["spec_first"] += spec_first_s
        totals["plain_first"] += plain_first_s
        runs.append(out.stats)
        # The first speculative step commits accepted + 1 tokens (the 1-token run cuts it).
        first_tokens += min(int(first.stats.accepted[0]) + 1, int(out.lengths[0]))
    stats = specjax.SpeculativeStats.merge(runs)
    tokens = int(stats.emitted.sum())
    end_to_end = totals["plain"] / totals["spec"]
    plain_decode = (totals["plain"] - totals["plain_first"]) / max(tokens - len(runs), 1)
    spec_decode = (totals["spec"] - totals["spec_first"]) / max(tokens - first_tokens, 1)
    decode = plain_decode / spec_decode
    tau = stats.mean_accepted_length
    costs = step_costs(target, draft, 1, [k], reps=args.reps, cache_slots=capacity,
                       position=int(lengths.mean()) + args.max_new_tokens // 2)
    c = costs["draft"] / costs["target"]
    v = costs[k + 1] / costs["target"]
    ideal = tau / (k * c + v)
    print(f"[speed] acceptance rate {stats.acceptance_rate:.2f}; tau (mean tokens per "
          f"target forward) {tau:.2f}; K = {k}; batch 1; median of {args.reps} alternating "
          "runs, compile excluded.")
    print(f"[speed] decode phase: {decode:.2f}x. After the first token, speculative decoding "
          f"made tokens {decode:.2f} times as fast as plain decoding of the same target.")
    print(f"[speed] end to end: {end_to_end:.2f}x. Including the prompt's prefill and the "
          f"first token, which both decoders pay, the whole request took "
          f"{totals['spec']:.2f} s instead of {totals['plain']:.2f} s.")
    print(f"[speed] why: each step runs K = {k} draft forwards costing c = {c:.3f} target "
          f"steps each and one {k + 1}-token verify costing v = {v:.2f} target steps, and "
          f"yields tau = {tau:.2f} tokens, so the ideal is tau / (K c + v) = {ideal:.2f}x "
          f"(measured {decode / ideal:.0%} of it).")
    if decode < 1.0 or ideal < 1.2:
        verdict = "does not pay" if decode < 1 else "pays little"
        reasons = []
        if v > 1.5:
            reasons.append(f"a {k + 1}-token verify costs v = {v:.2f} one-token steps (a CPU "
                           "runs several rows through its matrix units in series, while one "
                           "row mostly waits on memory)")
        if tau < 2.0:
            reasons.append(f"the draft is accepted rarely (tau = {tau:.2f} of at most {k + 1})")
        if k * c > 0.5:
            reasons.append(f"drafting costs K c = {k * c:.2f} target steps per step")
        if decode < 0.8 * ideal:
            reasons.append(f"the loop reaches only {decode / ideal:.0%} of the ideal (this "
                           "machine is noisy or loaded; rerun with more --reps)")
        print(f"[speed] here speculation {verdict}: " + "; ".join(reasons or ["see above"])
              + ". It pays where a verify costs about one step (v near 1: GPUs and TPUs, and "
              "models too large for the CPU cache; an NVIDIA H200 measured v = 1.0-1.3 for "
              "this pair) and acceptance is high (tau near K + 1).")
    print()


def _demo_head(target):
    """The shipped EAGLE-3 head of the bundled target, or None in a checkout without it."""
    import specjax_models
    from specjax_models.heads import load_head_for

    path = specjax_models.bundled.bundled_path("eagle3")
    return load_head_for(path, target) if (path / "head.npz").exists() else None


def run(args) -> int:
    import jax

    import specjax
    import specjax_models

    colour = use_colour(args.color)
    paint = painter(colour)
    marker = "" if colour else PROMPT_END_MARKER
    say("loading the bundled pair...")
    target, draft = load_model(None, "target"), load_model(None, "draft")
    tokenizer = specjax_models.ByteTokenizer()
    prompts = [p for p in specjax_models.bundled_prompts()
               if p["kind"] == "continue"][: args.prompts]
    sampling = specjax.SamplingConfig(temperature=args.temperature)
    key = jax.random.key(args.seed)
    print(f"specjax demo: bundled target ({num_params(target) / 1e6:.1f}M params) "
          f"and draft ({num_params(draft) / 1e6:.2f}M), byte-level, trained on "
          f"the Python standard library; K = {args.num_draft_tokens}, "
          f"{'greedy' if sampling.greedy else f'temperature {args.temperature}'}.")
    if colour:
        print(f"Colours: prompt {paint('dimmed', DIM)}, "
              f"{paint('accepted draft tokens', DRAFT_COLOUR)}, "
              f"{paint('tokens from the target', TARGET_COLOUR)}.")
    else:
        print(f"The prompt's last lines come first; '{PROMPT_END_MARKER.strip()}' marks where "
              "the generated text starts.")
    print()
    prompt_ids = [tokenizer.encode(p["text"]) for p in prompts]
    for prompt, ids in zip(prompts, prompt_ids, strict=True):
        print(paint(f"--- [draft model] {prompt['file']} (held out) ---", DIM))
        print(paint(prompt["text"][-160:], DIM) + marker, end="", flush=True)
        stats, *_ = stream_text(target, draft, ids, args, sampling, key, paint, None)
        print(f"[draft model] acceptance rate {stats.acceptance_rate:.2f}, tau "
              f"{stats.mean_accepted_length:.2f} tokens per target forward\n")

    head = _demo_head(target)
    if head is not None:
        prompt, ids = prompts[0], prompt_ids[0]
        print(paint(f"--- [EAGLE-3 head] {prompt['file']} (held out) again, drafted by a "
                    "one-layer head that reads the target's own hidden states, as an EAGLE-2 "
                    f"tree of {_demo_tree().num_nodes} nodes grown per step ---", DIM))
        print(paint(prompt["text"][-160:], DIM) + marker, end="", flush=True)
        stats, *_ = stream_text(target, head, ids, args, sampling, key, paint, None,
                                 tree=_demo_tree())
        print(f"[EAGLE-3 head] acceptance rate {stats.acceptance_rate:.2f}, tau "
              f"{stats.mean_accepted_length:.2f} tokens per target forward (nodes verified "
              f"per forward: {stats.nodes_per_step:.0f})\n")

    copy = next(p for p in specjax_models.bundled_prompts() if p["kind"] == "copy")
    print(paint(f"--- [prompt lookup] {copy['file']} (held out), asked to continue a copy of "
                "itself; drafts come from n-gram lookup in the text (no draft model) ---", DIM))
    print(paint(copy["text"][-160:], DIM) + marker, end="", flush=True)
    stats, *_ = stream_text(target, specjax.PromptLookup(), tokenizer.encode(copy["text"]),
                             args, sampling, key, paint, None)
    print(f"[prompt lookup] acceptance rate {stats.acceptance_rate:.2f}, tau "
          f"{stats.mean_accepted_length:.2f} tokens per target forward\n")
    say("measuring the speed of both decoders on the draft-model prompts...")
    _demo_speed(target, draft, prompt_ids, args, sampling, key)
    return 0
