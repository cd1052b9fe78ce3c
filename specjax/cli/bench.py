"""`specjax bench`: every method's speedup, acceptance, costs and exactness on your model
and prompts, by category (a Spec-Bench), as a table, JSON, CSV and an SVG chart.

Methods are named in one list, each with its own settings in brackets:
`--methods plain,prompt-lookup,draft[k=4],eagle3[tree=16/6/4],layer-skip[skip=4/6/8]`.
Every check that needs no model (methods, settings, prompt file, categories, outputs) runs
before anything loads; the measuring is `specjax.bench.run`.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from specjax.cli.bench_methods import METHODS, SETTINGS, MethodSpec, parse_methods
from specjax.cli.common import CliError, add_sampling, check_dir, recorded_command, say, seed_value

__all__ = ["METHODS", "SETTINGS", "MethodSpec", "parse_methods", "register", "run",
           "validate", "method_args", "machine_record"]


def register(sub) -> None:
    """Add the `bench` command's parser to the `specjax` subparsers."""
    line = lambda name, text: textwrap.fill(text, 88, initial_indent=f"  {name:14} ",
                                            subsequent_indent=" " * 17)
    epilog = ("methods:\n" + "\n".join(line(name, text) for name, (text, _) in METHODS.items())
              + "\n\nsettings (NAME[setting=value,...]):\n"
              + "\n".join(line(name, text) for name, text in SETTINGS.items()))
    bench = sub.add_parser(
        "bench", help="compare methods on your model and prompts (speedup, tau, exactness)",
        description=textwrap.fill(
            "Decode every prompt with every method and plain decoding: the speedup "
            "(tokens/s over plain decoding's, medians of alternating repetitions, compile "
            "excluded, a 95% bootstrap interval over prompts), tau, acceptance, the "
            "measured draft cost c and verify cost v, the ideal tau / (K c + v) and the "
            "efficiency, per category and overall; at temperature 0 every method's tokens "
            "must equal plain decoding's (exit status 1 otherwise). A markdown table goes "
            "to stdout.", 88),
        epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_argument("--methods", default=None,
                       help="comma-separated methods, each NAME or NAME[setting=value,...] "
                            "(below) (default: plain,prompt-lookup,draft on the bundled pair, "
                            "else plain,prompt-lookup)")
    bench.add_argument("--model", choices=["bundled", "smollm2"], default="bundled",
                       help="the target: the bundled byte-level code model or SmolLM2-135M-"
                            "Instruct (default: %(default)s)")
    bench.add_argument("--target", default=None,
                       help="a target checkpoint directory of the bundled model's kind")
    bench.add_argument("--hf", default=None, metavar="DIR",
                       help="the target from a Hugging Face model directory")
    bench.add_argument("--gguf", default=None, metavar="FILE",
                       help="the target from a GGUF file")
    bench.add_argument("--questions", default=None, metavar="FILE",
                       help="a JSONL question file in Spec-Bench's / MT-Bench's format "
                            "(\"turns\", \"category\", \"question_id\"; later turns follow "
                            "the target's own greedy answer to the earlier ones)")
    bench.add_argument("--prompts", default=None, metavar="FILE",
                       help="a text file, one prompt a line (category \"prompts\")")
    bench.add_argument("--categories", default=None, metavar="A,B",
                       help="only the questions of these categories")
    bench.add_argument("--limit", type=int, default=None, metavar="N",
                       help="at most N questions per category (the first ones)")
    bench.add_argument("--raw", action="store_true",
                       help="send prompts as raw text, without the model's chat template")
    bench.add_argument("--num-draft-tokens", type=int, default=6,
                       help="K for every method that does not set k= (default: %(default)s)")
    add_sampling(bench)
    bench.add_argument("--max-new-tokens", type=int, default=128,
                       help="new tokens per prompt (default: %(default)s)")
    bench.add_argument("--batch-size", type=int, default=1,
                       help="prompts decoded together (default: %(default)s)")
    bench.add_argument("--reps", type=int, default=3,
                       help="alternating repetitions per prompt batch (default: %(default)s)")
    bench.add_argument("--seed", type=seed_value, default=0,
                       help="PRNG seed (default: %(default)s)")
    bench.add_argument("--no-eos", action="store_true",
                       help="decode every prompt to --max-new-tokens")
    bench.add_argument("--json", default=None, metavar="FILE", help="write the report as JSON")
    bench.add_argument("--csv", default=None, metavar="FILE", help="write the rows as CSV")
    bench.add_argument("--markdown", default=None, metavar="FILE",
                       help="write the table with the command, machine and settings above "
                            "it (the form of benchmarks/results/*.md)")
    bench.add_argument("--resume", action="store_true",
                       help="continue a killed run from its journal (FILE.journal.jsonl "
                            "beside --json or --csv)")
    bench.set_defaults(handler=run)


def _positive(value, option: str) -> None:
    if value is not None and value < 1:
        raise CliError(f"{option} must be >= 1, got {value}")


def validate(args) -> tuple[list[MethodSpec], list]:
    """Every check that needs no model: methods, numbers, targets, outputs, prompts."""
    from specjax.bench.prompts import check_categories, read_questions, select_categories

    bundled = args.model == "bundled" and not (args.hf or args.gguf)
    specs = parse_methods(args.methods or ("plain,prompt-lookup,draft" if bundled
                                           else "plain,prompt-lookup"))
    for value, option in ((args.num_draft_tokens, "--num-draft-tokens"),
                          (args.max_new_tokens, "--max-new-tokens"),
                          (args.batch_size, "--batch-size"), (args.reps, "--reps"),
                          (args.limit, "--limit")):
        _positive(value, option)
    if sum(bool(x) for x in (args.hf, args.gguf, args.target)) > 1 or (
            (args.hf or args.gguf) and args.model != "bundled"):
        raise CliError("choose one target: --model, --target DIR, --hf DIR or --gguf FILE")
    check_dir(args.target, "--target")
    check_dir(args.hf, "--hf")
    if args.questions and args.prompts:
        raise CliError("--questions and --prompts both name the prompts; pass one")
    if args.resume and not (args.json or args.csv or args.markdown):
        raise CliError("--resume continues from the journal beside --json, --csv or "
                       "--markdown; pass the killed run's output option")
    for path, option in ((args.json, "--json"), (args.csv, "--csv"),
                         (args.markdown, "--markdown")):
        if path and (Path(path).is_dir() or not Path(path).resolve().parent.is_dir()):
            raise CliError(f"{option} {path}: not a file in an existing folder")
    for spec in specs:
        _check_spec(spec, bundled)
    source = args.questions or args.prompts
    if source is None:
        if not bundled:
            raise CliError("pass the prompts: --questions FILE.jsonl (Spec-Bench's / "
                           "MT-Bench's format) or --prompts FILE (one a line); only the "
                           "bundled pair has default prompts")
        questions = _bundled_questions()
    else:
        try:
            questions = read_questions(source, "jsonl" if args.questions else "text")
        except ValueError as error:
            raise CliError(f"{'--questions' if args.questions else '--prompts'}: "
                           f"{error}") from None
    categories = None if args.categories is None else [
        c.strip() for c in args.categories.split(",") if c.strip()]
    try:
        questions = select_categories(questions, categories)
    except ValueError as error:
        raise CliError(f"--categories: {error}") from None
    try:
        check_categories(questions)
    except ValueError as error:
        raise CliError(f"{'--questions' if args.questions else '--prompts'}: {error}") from None
    if args.limit is not None:  # the first --limit questions of each category
        rank: dict[str, int] = {}
        limited = []
        for question in questions:
            rank[question.category] = rank.get(question.category, 0) + 1
            if rank[question.category] <= args.limit:
                limited.append(question)
        questions = limited
    return specs, questions


def _check_typical_settings(args, specs: list[MethodSpec]) -> None:
    """--typical-epsilon / --typical-delta: refused unless some method runs the typical
    rule (--verification typical, or a method's verification=typical); their values
    checked once, as options of the run."""
    from specjax.cli.common import verification_rule

    uses_typical = args.verification == "typical" or any(
        s.get("verification") == "typical" for s in specs)
    typical = argparse.Namespace(verification="typical" if uses_typical else None,
                                 typical_epsilon=args.typical_epsilon,
                                 typical_delta=args.typical_delta)
    verification_rule(typical)


def _check_spec(spec: MethodSpec, bundled: bool) -> None:
    for name in ("k", "ngram"):
        value = spec.get(name)
        if value is not None and (not value.isdigit() or int(value) < 1):
            raise CliError(f"--methods {spec.label}: {name} must be a positive integer, got "
                           f"{value!r}")
    if spec.get("confidence") is not None:
        try:
            float(spec.get("confidence"))
        except ValueError:
            raise CliError(f"--methods {spec.label}: confidence must be a number in (0, 1], "
                           f"got {spec.get('confidence')!r}") from None
    rule = spec.get("verification")
    if rule is not None and rule not in ("block", "traversal", "token", "typical"):
        raise CliError(f"--methods {spec.label}: verification must be block, traversal, token "
                       f"(the exact rules) or typical (NOT exact; --typical-epsilon and "
                       f"--typical-delta set it), got {rule!r}")
    if spec.kind == "published" and spec.get("dir") is None:
        raise CliError(f"--methods {spec.label}: published needs dir=DIR (the drafter's "
                       "directory)")
    if spec.kind == "layer-skip" and spec.get("skip") is None:
        raise CliError(f"--methods {spec.label}: layer-skip needs skip=4/6/8 or skip=auto")
    directory = spec.get("dir")
    if directory is not None and not Path(directory).exists():
        raise CliError(f"--methods {spec.label}: dir {directory} does not exist")


def _bundled_questions() -> list:
    import specjax_models
    from specjax.bench.prompts import Question

    return [Question(f"{p['kind']} {i}", p["kind"], (p["text"],))
            for i, p in enumerate(specjax_models.bundled.bundled_prompts())]


def method_args(args, spec: MethodSpec) -> argparse.Namespace:
    """The decoding commands' options for one method, as `load_drafter_choice` reads
    them."""
    given = dict(spec.settings)
    kind = spec.kind
    directory = given.get("dir")
    method = argparse.Namespace(**vars(args))
    method.drafter = METHODS[kind][1] if kind != "published" else None
    method.draft = directory if kind in ("draft", "parallel") else None
    method.head = directory if kind in ("kangaroo", "medusa", "eagle", "eagle3", "mtp",
                                        "p-eagle") else None
    method.drafter_dir = directory if kind == "published" else None
    method.datastore = directory if kind == "retrieval" else None
    method.greedy_draft = given.get("greedy", "off") != "off"
    method.min_confidence = None if "confidence" not in given else float(given["confidence"])
    method.skip = given.get("skip")
    method.lookahead = given.get("lookahead", "5,4,5").replace("/", ",")
    method.max_ngram_size = int(given.get("ngram", 3))
    method.min_ngram_size = min(2, method.max_ngram_size)
    method.num_draft_tokens = int(given.get("k", args.num_draft_tokens))
    method.k_from_heads = kind in ("medusa", "published") and "k" not in given
    method.dynamic_tree = given["tree"].replace("/", ",") if "tree" in given else None
    method.verification = given.get("verification", args.verification)
    if method.verification != "typical":  # the typical rule's settings are not this rule's
        method.typical_epsilon = method.typical_delta = None
    method.adaptive_length = False
    method.no_speculation = False
    method.prefill_chunk = None
    method.layers = "unrolled"
    method.mesh = None
    return method


def run(args) -> int:
    from specjax.cli.common import rule_for, verification_rule
    from specjax.cli.loading import (
        check_min_confidence,
        check_model_free_options,
        check_parallel_options,
        check_published_options,
        drafter_choice,
        parse_tree,
    )

    specs, questions = validate(args)
    _check_typical_settings(args, specs)
    # The decoding commands' own checks, per method, before any model loads.
    prepared = []
    for spec in specs:
        if spec.kind == "plain":
            prepared.append((spec, None, None))
            continue
        margs = method_args(args, spec)
        try:
            check_published_options(margs)
            check_parallel_options(margs)
            tree = parse_tree(margs)
            margs.verification_rule = verification_rule(margs)
            rule_for(margs, tree, drafts_own_tree=drafter_choice(margs) in (
                "lookahead", "retrieval"))
            check_min_confidence(margs, tree)
            check_model_free_options(margs)
        except CliError as error:
            raise CliError(f"--methods {spec.label}: {error}") from None
        prepared.append((spec, margs, (tree, margs.verification_rule)))
    return _measure(args, prepared, questions)


def _measure(args, prepared, questions) -> int:
    import jax

    import specjax
    from specjax.bench.prompts import bench_prompts, raw_chat_text
    from specjax.bench.runner import BenchMethod
    from specjax.bench.runner import run as bench_run
    from specjax.cli.loading import (
        drafter_choice,
        load_drafter_choice,
        load_target,
        search_layer_skip,
    )

    sampling = specjax.SamplingConfig(temperature=args.temperature, top_k=args.top_k,
                                      top_p=args.top_p)
    args.prefill_chunk, args.layers, args.mesh, args.draft = None, "unrolled", None, None
    target, tokenizer = load_target(args, needs_draft=any(
        s.kind == "draft" and not s.get("dir") for s, _, _ in prepared))
    chat = bool(getattr(tokenizer, "chat_template", None)) or args.model == "smollm2"
    chat = chat and not args.raw and (args.hf or args.gguf or args.model == "smollm2")
    eos = None if args.no_eos else ((tokenizer.eos_ids or None) if chat or args.hf
                                    or args.gguf or args.model == "smollm2"
                                    else tokenizer.eos_id)

    def encode(messages):
        if chat:
            return tokenizer.apply_chat_template(messages)
        return tokenizer.encode(raw_chat_text(messages))

    def answer(chats):
        out = specjax.generate(target, [list(c) for c in chats],
                               max_new_tokens=args.max_new_tokens, sampling=specjax.GREEDY,
                               eos_id=eos)
        return [tokenizer.decode(row[:int(n)].tolist()) for row, n in
                zip(jax.device_get(out.tokens), jax.device_get(out.lengths), strict=True)]

    limit = None if target.max_seq_len is None else target.max_seq_len - args.max_new_tokens
    try:
        prompts = bench_prompts(questions, encode=encode, answer=answer, max_tokens=limit)
    except ValueError as error:
        raise CliError(f"{'--questions' if args.questions else '--prompts'}: {error}") from None
    methods = []
    for spec, margs, shape in prepared:
        if margs is None:
            methods.append(BenchMethod("plain"))
            continue
        drafter = load_drafter_choice(margs, drafter_choice(margs), target, sampling,
                                      specjax.PromptLookup(max_ngram_size=margs.max_ngram_size,
                                                           min_ngram_size=margs.min_ngram_size))
        if drafter is None:  # skip=auto: searched on the first prompt
            drafter = search_layer_skip(margs, target, list(prompts[0].ids), sampling,
                                        jax.random.key(args.seed))
        tree, rule = shape
        methods.append(BenchMethod(spec.label, drafter, margs.num_draft_tokens, tree, rule))
    chosen = args.json or args.csv or args.markdown
    output = Path(chosen) if chosen else None
    journal = None if output is None else output.with_name(output.name + ".journal.jsonl")
    say(f"specjax bench: {len(methods)} methods x {len(prompts)} prompts "
        f"({len({p.category for p in prompts})} categories), {args.reps} repetitions")
    machine = machine_record()
    report = bench_run(target, methods, prompts, max_new_tokens=args.max_new_tokens,
                       sampling=sampling, batch_size=args.batch_size, reps=args.reps,
                       seed=args.seed, eos_id=eos, journal=journal, resume=args.resume,
                       progress=_progress_bar(), log=say)
    report.settings["machine"] = machine
    print(report.to_markdown())
    if args.json:
        report.to_json(args.json)
    if args.csv:
        report.to_csv(args.csv)
    if args.markdown:
        Path(args.markdown).write_text(_markdown_page(report, machine, args))
    if output is not None:
        report.to_svg(output.with_suffix(".svg"))
        written = [p for p in (args.json, args.csv, args.markdown) if p]
        say(f"specjax bench: wrote {', '.join(written)} and {output.with_suffix('.svg')}")
    if not report.ok:
        say(f"specjax bench: {len(report.failures)} exactness failure(s) at temperature 0 "
            "(listed under the table)")
        return 1
    return 0


def machine_record() -> dict:
    """What ran the measurement: the CPU, the accelerator, jax, the command line."""
    import os
    import platform

    import jax

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info
                        if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "backend": jax.default_backend(),
            "devices": [str(d) for d in jax.devices()], "jax": jax.__version__,
            "command": recorded_command(sys.argv[1:])}


def _markdown_page(report, machine: dict, args) -> str:
    sampling = report.settings["sampling"]
    return (f"# specjax bench\n\n`{machine['command']}` on {machine['cpu']} "
            f"({machine['cores']} cores, {machine['backend']}, jax {machine['jax']}). "
            f"{args.max_new_tokens} new tokens per prompt, batch {args.batch_size}, "
            f"temperature {sampling['temperature']}, top-k {sampling['top_k']}, top-p "
            f"{sampling['top_p']}; speedup: tokens/s over plain decoding's, summed over "
            f"prompts, each the median of {args.reps} alternating repetitions, compile "
            "excluded (its seconds apart), 95% bootstrap interval over prompt batches; tau: "
            "tokens per target forward; c: a draft per step's block C over K, v: the verify "
            "forward at the method's mean width, both in one-token target forwards; ideal "
            "tau / (K c + v); efficiency: speedup / ideal (docs/benchmarks.md).\n\n"
            + report.to_markdown() + "\n")


def _progress_bar():
    """A progress line on stderr: units done, each method's running speedup."""
    interactive = sys.stderr.isatty()

    def show(done: int, total: int, speedups: dict) -> None:
        filled = int(20 * done / total)
        estimate = "  ".join(f"{name} {value:.2f}x" for name, value in speedups.items())
        line = f"[{'#' * filled}{'.' * (20 - filled)}] {done}/{total}  {estimate}"
        if interactive:
            print("\r" + line, end="\n" if done == total else "", file=sys.stderr, flush=True)
        else:
            say(line)

    return show
