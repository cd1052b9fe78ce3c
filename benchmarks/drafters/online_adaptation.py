"""Online speculative decoding (OSD): the bundled draft, trained on Python code, adapting
to English prose while it serves it.

The stream: `--prompts` prompts cut from the English reference text in Python's own
`pydoc_data.topics` (prose the draft never trained on; nothing downloaded), `--prompt-
bytes` each, decoded greedily by the bundled target with the bundled draft (K = 4) in
batches of `--batch`, `--new-tokens` each. After every batch the `OnlineDistiller` takes
its optimizer steps on the texts so far. Recorded per batch: the acceptance rate of that
batch (drafted by the draft as it was before the batch's update), and, every
`--eval-every` batches, the acceptance on a fixed held-out set of prose prompts with the
draft of that moment. The same held-out set with the frozen draft gives the baseline;
the goal is +0.1 acceptance by the end of the stream. The curve goes to
`online_adaptation_cpu.svg`. The offline ceiling: the shipped draft distilled on all the
served texts at once, the most any online schedule could reach with this draft.

    python -m benchmarks.drafters.online_adaptation [--prompts 500] [--batch 10] [--new-tokens 32]
        [--divergence tvd|fkl] [--agreed-weight W] [--steps-per-update S] [--ceiling-steps N]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

import specjax
import specjax_models
from benchmarks.common import RESULTS, machine_record, write_results
from specjax.training.online import OnlineConfig, OnlineDistiller

NAME = "online_adaptation_cpu"
K = 4


def prose_prompts(count: int, length: int, seed: int) -> list[str]:
    """`count` distinct prose snippets of `length` characters from pydoc's topics, each
    starting at a word (a pure function of seed)."""
    from pydoc_data.topics import topics

    text = " ".join(" ".join(body.split()) for _, body in sorted(topics.items()))
    text = "".join(c for c in text if c.isascii())
    rng = np.random.default_rng(seed)
    starts = sorted(set(int(s) for s in rng.integers(0, len(text) - length - 1, 4 * count)))
    rng.shuffle(starts)
    prompts = []
    for start in starts:
        start = text.find(" ", start) + 1
        if 0 < start < len(text) - length:
            prompts.append(text[start:start + length])
        if len(prompts) == count:
            break
    return prompts


def acceptance(target, drafter, prompts, new_tokens: int) -> float:
    out = specjax.speculative_generate(target, drafter, prompts, max_new_tokens=new_tokens,
                                       num_draft_tokens=K, sampling=specjax.GREEDY)
    return float(out.stats.acceptance_rate)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=500)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prompt-bytes", type=int, default=160)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--steps-per-update", type=int, default=4)
    parser.add_argument("--agreed-weight", type=float, default=0.1)
    parser.add_argument("--divergence", choices=("tvd", "fkl"), default="tvd")
    parser.add_argument("--name", default=NAME, help="results file name (a sweep's runs)")
    parser.add_argument("--ceiling-steps", type=int, default=500,
                        help="the offline ceiling's steps (0: none)")
    args = parser.parse_args()
    target = specjax_models.load_bundled("target")
    draft = specjax_models.load_bundled("draft")
    tokenizer = specjax_models.ByteTokenizer()
    encode = lambda texts: [tokenizer.encode(t) for t in texts]
    stream = encode(prose_prompts(args.prompts, args.prompt_bytes, seed=0))
    held_out = encode(prose_prompts(40, args.prompt_bytes, seed=1))
    held_out = [p for p in held_out if p not in stream][:32]
    config = OnlineConfig(learning_rate=args.learning_rate,
                          steps_per_update=args.steps_per_update, batch_size=16, window=256,
                          buffer_size=512, agreed_weight=args.agreed_weight,
                          divergence=args.divergence)
    distiller = OnlineDistiller(target, specjax.DraftModel(draft, "greedy"), config, seed=0)
    frozen = acceptance(target, distiller.drafter, held_out, args.new_tokens)
    print(f"held-out acceptance, the draft as shipped: {frozen:.3f}", flush=True)
    curve, evals, start = [], [(0, frozen)], time.perf_counter()
    served = []  # (prompt, generated) of the whole stream, for the offline ceiling
    for index in range(0, len(stream), args.batch):
        batch = stream[index:index + args.batch]
        out = distiller.generate(batch, max_new_tokens=args.new_tokens, num_draft_tokens=K,
                                 sampling=specjax.GREEDY)
        tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
        served += [(p, tokens[b, :lengths[b]].tolist()) for b, p in enumerate(batch)]
        seen = index + len(batch)
        curve.append((seen, float(out.stats.acceptance_rate), distiller.losses[-1]))
        if (index // args.batch + 1) % args.eval_every == 0 or seen == len(stream):
            evals.append((seen, acceptance(target, distiller.drafter, held_out,
                                           args.new_tokens)))
            print(f"{seen} prompts: stream {curve[-1][1]:.3f}, held-out {evals[-1][1]:.3f}, "
                  f"loss {curve[-1][2]:.4f}", flush=True)
    seconds = time.perf_counter() - start
    ceiling = (offline_ceiling(target, draft, config, served, held_out, args)
               if args.ceiling_steps else [])
    result = {"benchmark": "online_adaptation", "machine": machine_record(), "args": vars(args),
              "held_out_frozen": frozen, "held_out": evals, "stream": curve,
              "seconds": seconds, "offline_ceiling": ceiling}
    write_svg(args.name, evals, curve)
    write_report(result)


def offline_ceiling(target, draft, config, served, held_out, args) -> list:
    """The shipped draft distilled offline on every text of the stream at once, with the
    same loss and optimizer, for `--ceiling-steps` steps: what this draft can reach on this
    traffic with no schedule at all, the bound on what serving it online can reach.
    [(steps, held-out acceptance)] every 100 steps."""
    offline = OnlineDistiller(target, specjax.DraftModel(draft, "greedy"),
                              dataclasses.replace(config, steps_per_update=100), seed=1)
    offline.observe([p for p, _ in served], [g for _, g in served])
    points = []
    for round_index in range(1, -(-args.ceiling_steps // 100) + 1):
        offline.update()
        points.append((100 * round_index, acceptance(target, offline.drafter, held_out,
                                                     args.new_tokens)))
        print(f"offline ceiling, {points[-1][0]} steps: held-out {points[-1][1]:.3f}",
              flush=True)
    return points


def write_svg(name: str, evals, curve) -> None:
    """The acceptance curves (held-out and per stream batch) as a small SVG line chart."""
    width, height, pad = 640, 320, 40
    last = max(point[0] for point in evals)
    x = lambda seen: pad + (width - 2 * pad) * seen / max(last, 1)
    y = lambda rate: height - pad - (height - 2 * pad) * rate
    line = lambda points, colour: (
        f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="'
        + " ".join(f"{x(s):.1f},{y(r):.1f}" for s, r in points) + '"/>')
    ticks = "".join(f'<text x="{pad - 30}" y="{y(r) + 4:.1f}" font-size="11">{r:.1f}</text>'
                    for r in (0.0, 0.25, 0.5, 0.75, 1.0))
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">'
           f'<rect width="{width}" height="{height}" fill="white"/>{ticks}'
           f'<line x1="{pad}" y1="{y(0)}" x2="{width - pad}" y2="{y(0)}" stroke="black"/>'
           f'<line x1="{pad}" y1="{y(0)}" x2="{pad}" y2="{y(1)}" stroke="black"/>'
           + line([(s, r) for s, r, _ in curve], "#9ab")
           + line(evals, "#c33")
           + f'<text x="{pad}" y="20" font-size="13">acceptance vs prompts served: held-out '
           f'(red), each stream batch (grey)</text></svg>\n')
    (RESULTS / f"{name}.svg").write_text(svg)


def write_report(result: dict) -> None:
    args = argparse.Namespace(**{"divergence": "tvd", "name": NAME, "ceiling_steps": 0,
                                 **result["args"]})
    divergence = {"tvd": "total-variation", "fkl": "forward-KL"}[args.divergence]
    machine = result["machine"]
    evals = result["held_out"]
    gain = evals[-1][1] - result["held_out_frozen"]
    lines = [
        "# Online speculative decoding: the bundled code draft adapting to English prose", "",
        f"`python -m benchmarks.drafters.online_adaptation --prompts {args.prompts} --batch "
        f"{args.batch} --new-tokens {args.new_tokens} --learning-rate {args.learning_rate} "
        f"--steps-per-update {args.steps_per_update} --agreed-weight {args.agreed_weight} "
        f"--divergence {args.divergence} --ceiling-steps {args.ceiling_steps}` on "
        f"{machine.get('cpu_model') or 'this CPU'} ({machine.get('cpu_count')} cores), "
        f"{result['seconds']:.0f} s. A stream of {args.prompts} prose prompts "
        f"({args.prompt_bytes} bytes each, from Python's pydoc topics, a domain the draft "
        f"never trained on), greedy, K = {K}, batches of {args.batch}; after each batch "
        f"{args.steps_per_update} Adam steps (learning rate {args.learning_rate}) of "
        f"{divergence} distillation on the texts so far, positions the draft missed "
        f"first (weight {args.agreed_weight} where it agreed). Held-out: 32 other prose "
        "prompts, decoded with the draft of that moment.", "",
        f"Held-out acceptance: {result['held_out_frozen']:.3f} with the draft as shipped, "
        f"{evals[-1][1]:.3f} after the stream ({gain:+.3f}; goal +0.1). Curve: "
        f"`{args.name}.svg`.", "",
        "| prompts served | held-out acceptance |", "|---|---|"]
    lines += [f"| {seen} | {rate:.3f} |" for seen, rate in evals]
    ceiling = result.get("offline_ceiling") or []
    if ceiling:
        best = max(rate for _, rate in ceiling)
        lines += ["", "Offline ceiling: the shipped draft distilled on all of the stream's "
                  "texts at once (same loss and optimizer, no schedule), held-out acceptance "
                  "by steps: " + ", ".join(f"{steps}: {rate:.3f}" for steps, rate in ceiling)
                  + f". Best {best:.3f} ({best - result['held_out_frozen']:+.3f}): the most "
                  "this draft reaches on this traffic, whatever the online schedule."]
    write_results(args.name, result, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
