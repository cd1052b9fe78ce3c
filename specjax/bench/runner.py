"""A Spec-Bench for your own model and prompts: every method's decode speed against plain
decoding, its acceptance, its measured step costs and its exactness, in one run.

`run(target, methods, prompts, ...)` decodes every prompt with every method (plain
decoding always among them, the baseline) and returns a `specjax.bench.report.BenchReport`:
a row per method and category (and "overall") with the speedup over plain decoding and a
bootstrap interval over the prompts, tau, acceptance, tokens/s, compile time (kept apart),
the measured draft cost and verify cost, the ideal tau / (K c + v) and the efficiency
reached; at temperature 0, any method whose tokens differ from plain decoding's is a
failure that names the prompt. `specjax bench` (the command line) loads the models and
prompts and calls this.

How it measures (DESIGN.md section 7): prompts are grouped by category into batches of
`batch_size` (a unit); for each unit, every method runs once with one new token (the
compile, for shapes not seen before, timed apart), then `reps` rounds each run every
method in turn (alternation: machine noise hits them alike) and a method's time on the
unit is the median of its rounds. Speedups are ratios of tokens/s summed over units. Each
method's costs are measured once, on its first unit, in the step's own units:
C = one step's whole draft block (`propose`, jitted, as the decode loop runs it) and
v(w) = a w-token target forward, both in one-token target forwards; v is taken at the
method's mean verify width. A run with a `journal` appends every finished unit to it, and
`resume=True` skips the units it holds.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
import warnings
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.bench.journal import Journal
from specjax.bench.prompts import BenchPrompt, check_categories
from specjax.bench.report import PLAIN, BenchReport, summarise
from specjax.decoding.autoregressive import generate
from specjax.decoding.inputs import bucket, plan_capacity
from specjax.decoding.sampling import GREEDY, SamplingConfig, sampling_params
from specjax.decoding.speculative_loop import (
    drafters_tree,
    init_speculative_state,
    speculative_config,
    speculative_generate,
)
from specjax.decoding.step import propose
from specjax.lm.causal_lm import CausalLM
from specjax.runtime.fingerprints import hash_arrays, params_fingerprint
from specjax.runtime.timing import forward_timer, wall_seconds
from specjax.verification.rules import verification_name


@dataclasses.dataclass(frozen=True)
class BenchMethod:
    """One method of a run: a name for the tables, the drafter (None: plain decoding),
    K (`num_draft_tokens`; with a tree, its nodes), the tree and the verification rule
    (None: the shape's default), as `speculative_generate` takes them."""

    name: str
    drafter: object = None
    num_draft_tokens: int | None = 6
    tree: object = None
    verification: object = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"BenchMethod needs a name, got {self.name!r}")
        if (self.drafter is None) != (self.name == PLAIN):
            raise ValueError(f"BenchMethod {self.name!r}: the method named {PLAIN!r} is plain "
                             "decoding (drafter None), and every other method needs a "
                             "drafter")

    @property
    def speculative(self) -> bool:
        return self.drafter is not None

    def verify_nodes(self) -> int:
        """The nodes a full verify checks: the tree's, else K."""
        tree = drafters_tree(self.drafter, self.tree)
        return tree.num_nodes if tree is not None else int(self.num_draft_tokens)


def plan_units(prompts: Sequence[BenchPrompt], batch_size: int) -> list[list[int]]:
    """Prompt indices in batches of at most `batch_size`, never mixing categories (in the
    order categories first appear)."""
    by_category: dict[str, list[int]] = {}
    for index, prompt in enumerate(prompts):
        by_category.setdefault(prompt.category, []).append(index)
    return [indices[i:i + batch_size] for indices in by_category.values()
            for i in range(0, len(indices), batch_size)]


@dataclasses.dataclass(frozen=True)
class _Settings:
    max_new_tokens: int
    sampling: SamplingConfig
    batch_size: int
    reps: int
    seed: int
    eos_id: object
    cache_size: int

    def key(self):
        return jax.random.key(self.seed)


def _decode(target: CausalLM, method: BenchMethod, prompts: list[list[int]], settings,
            max_new_tokens: int):
    if not method.speculative:
        return generate(target, prompts, max_new_tokens=max_new_tokens,
                        sampling=settings.sampling, key=settings.key(),
                        eos_id=settings.eos_id, cache_size=settings.cache_size)
    tree = drafters_tree(method.drafter, method.tree)
    return speculative_generate(
        target, method.drafter, prompts, max_new_tokens=max_new_tokens,
        num_draft_tokens=None if tree is not None else method.num_draft_tokens,
        sampling=settings.sampling, key=settings.key(), eos_id=settings.eos_id,
        cache_size=settings.cache_size, tree=method.tree, verification=method.verification)


def _rows(out) -> list[list[int]]:
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    return [tokens[b, :int(lengths[b])].tolist() for b in range(len(lengths))]


def _counts(out) -> dict:
    stats = getattr(out, "stats", None)
    if stats is None:
        return {}
    return {"emitted": int(stats.emitted.sum()), "target_forwards": int(
        stats.target_forwards.sum()), "proposed": int(stats.proposed.sum()),
        "accepted": int(stats.accepted.sum()), "verification": stats.verification}


def unit_shape(prompts: Sequence[BenchPrompt], unit: Sequence[int]) -> tuple[int, int]:
    """The decoders' input shape for a unit: (rows, the longest prompt's bucket)."""
    return len(unit), bucket(max(len(prompts[i].ids) for i in unit))


def measure_unit(target: CausalLM, methods: Sequence[BenchMethod],
                 prompts: Sequence[BenchPrompt], settings: _Settings, compiled: dict) -> dict:
    """One unit: compile what is new, `reps` alternating rounds, the median seconds, the
    tokens and counts of each method, and (greedy) the rows whose tokens left plain
    decoding's. `compiled`: (method name, shape) -> "here" (compiled in this process; no
    warm-up) or "journal" (warmed up, its compile seconds already in a resumed unit)."""
    ids = [list(p.ids) for p in prompts]
    calls = {m.name: functools.partial(_decode, target, m, ids, settings) for m in methods}
    record = {m.name: {"compile_seconds": 0.0, "seconds": []} for m in methods}
    shape = (len(ids), bucket(max(map(len, ids))))
    for name, call in calls.items():
        if compiled.get((name, shape)) != "here":  # a 1-token request with the same shapes
            seconds = wall_seconds(lambda c=call: c(1))[1]
            # A resumed run warms up again; the journal's unit already holds the seconds.
            record[name]["compile_seconds"] = seconds if (name, shape) not in compiled else 0.0
            compiled[(name, shape)] = "here"
    outputs = {}
    for _ in range(settings.reps):
        for name, call in calls.items():
            out, seconds = wall_seconds(lambda c=call: c(settings.max_new_tokens))
            record[name]["seconds"].append(seconds)
            outputs[name] = out
    plain_rows = _rows(outputs[PLAIN])
    for method in methods:
        rows = _rows(outputs[method.name])
        entry = record[method.name]
        entry.update(tokens=sum(map(len, rows)), median_seconds=float(np.median(
            entry["seconds"])), **_counts(outputs[method.name]))
        if settings.sampling.greedy:
            entry["mismatches"] = [
                {"prompt": p.name, "category": p.category,
                 "position": first_difference(mine, plain)}
                for p, mine, plain in zip(prompts, rows, plain_rows, strict=True)
                if mine != plain]
    return record


def first_difference(mine: list[int], theirs: list[int]) -> int:
    """The first new-token position where two rows differ (the shorter one's length when
    one is a prefix of the other)."""
    for position, (a, b) in enumerate(zip(mine, theirs, strict=False)):
        if a != b:
            return position
    return min(len(mine), len(theirs))


def _draft_block_timer(target: CausalLM, method: BenchMethod, ids: list[list[int]],
                       settings: _Settings, steps: int = 8) -> Callable[[], float]:
    """Seconds of one step's draft block (the drafter's `propose`), `steps` of them inside
    one jit as the decode loop runs them (no per-call dispatch), from the state after the
    prefill of `ids`."""
    state, drafter = init_speculative_state(
        target, method.drafter, ids, max_new_tokens=settings.max_new_tokens,
        num_draft_tokens=None if drafters_tree(method.drafter, method.tree) is not None
        else method.num_draft_tokens, sampling=settings.sampling, key=settings.key(),
        eos_id=settings.eos_id, cache_size=settings.cache_size, tree=method.tree,
        verification=method.verification)
    config = speculative_config(None if drafters_tree(method.drafter, method.tree) is not None
                                else method.num_draft_tokens, settings.sampling,
                                method.tree, drafter, method.verification)
    params = sampling_params(config.sampling, int(state.lengths.shape[0]))

    @jax.jit
    def loop(target, drafter, state):
        def body(step, carry):
            state, checksum = carry
            drafter_state, proposal, cache = propose(
                drafter, state, jax.random.fold_in(state.key, step), config, target, params)
            state = dataclasses.replace(state, drafter_state=drafter_state,
                                        target_cache=cache)
            return state, checksum + proposal.tokens.sum()

        return jax.lax.fori_loop(0, steps, body, (state, jnp.int32(0)))[1]

    jax.block_until_ready(loop(target, drafter, state))
    return lambda: wall_seconds(lambda: loop(target, drafter, state))[1] / steps


def measure_costs(target: CausalLM, method: BenchMethod, ids: list[list[int]],
                  settings: _Settings, reps: int = 5) -> dict:
    """The method's draft block and the target's forwards at the widths a verify of this
    method can take (1, 2, half and all of its nodes + 1), in seconds, medians of `reps`
    alternating rounds, at the unit's batch, context at half the new tokens."""
    from specjax.runtime.timing import interleaved_medians

    nodes = method.verify_nodes()
    widths = sorted({1, 2, (nodes + 2) // 2, nodes + 1})
    position = min(max(map(len, ids)) + settings.max_new_tokens // 2,
                   settings.cache_size - nodes - 2)
    timers = {width: forward_timer(target, len(ids), width, cache_slots=settings.cache_size,
                                   position=position) for width in widths}
    timers["draft"] = _draft_block_timer(target, method, ids, settings)
    seconds = interleaved_medians(timers, reps)
    return {"draft_seconds": seconds.pop("draft"),
            "forward_seconds": {str(w): s for w, s in seconds.items()}}


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, default=str).encode()).hexdigest()


def describe_drafter(drafter) -> dict:
    """A drafter as a journal's fingerprint sees it: its class, its static settings and
    the content of its weights (a model inside it by `params_fingerprint`, remembered)."""
    leaves, structure = jax.tree_util.tree_flatten(
        drafter, is_leaf=lambda x: isinstance(x, CausalLM))
    return {"type": f"{type(drafter).__module__}.{type(drafter).__qualname__}",
            # Static settings as jax sees them, without object addresses (new each process).
            "structure": re.sub(r" at 0x[0-9a-fA-F]+", "", str(structure)),
            "weights": [params_fingerprint(x) if isinstance(x, CausalLM) else hash_arrays(x)
                        for x in leaves]}


def fingerprint(target, methods, prompts, settings) -> dict:
    """What a journal must match to be resumed, as a header: a digest of each part (the
    target's weights and sizes, each method's drafter and settings, the prompts, the
    run's settings: sampling, K, the verification rule, new tokens, batch, seed) and of
    all of them."""
    parts = {
        "target": _digest({"weights": params_fingerprint(target),
                           "vocab_size": target.vocab_size,
                           "max_seq_len": target.max_seq_len,
                           "shapes": [(str(x.shape), str(x.dtype))
                                      for x in jax.tree.leaves(target.params)]}),
        "methods": _digest([{"name": m.name, "num_draft_tokens": m.num_draft_tokens,
                             "tree": repr(m.tree), "verification": None
                             if m.verification is None else verification_name(
                                 m.verification)} for m in methods]),
        "drafters": _digest([None if m.drafter is None else describe_drafter(m.drafter)
                             for m in methods]),
        "prompts": _digest([(p.ids, p.category, p.name) for p in prompts]),
        "settings": _digest(repr(settings)),
    }
    return {"fingerprint": _digest(parts), "parts": parts}


def run(target: CausalLM, methods: Sequence[BenchMethod], prompts: Sequence[BenchPrompt], *,
        max_new_tokens: int, sampling: SamplingConfig = GREEDY, batch_size: int = 1,
        reps: int = 3, seed: int = 0, eos_id=None, journal=None, resume: bool = False,
        progress: Callable[[int, int, dict], None] | None = None, cost_reps: int = 5,
        bootstrap_samples: int = 2000, log: Callable[[str], None] | None = None
        ) -> BenchReport:
    """Benchmark `methods` (plain decoding is added first when absent) on `prompts`;
    returns the `BenchReport`. `progress(done, total, speedups)` is called after every
    unit measured (and once for the units a resumed journal holds) with the running
    speedup of each method. `journal`: a file that every finished unit is appended to
    (`specjax.bench.journal`: it survives a kill at any byte); with `resume=True` the
    units it holds are not run again (it must come from the same target weights,
    drafters, methods, prompts and settings: refused otherwise, naming what differs).
    `log(message)`: what the journal's reading has to say (a torn line dropped, a fresh
    start); by default a warning."""
    methods = list(methods)
    if not methods:
        raise ValueError("run needs at least one method")
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise ValueError(f"method names repeat: {names}; give each a name of its own")
    if PLAIN not in names:
        methods.insert(0, BenchMethod(PLAIN))
    prompts = list(prompts)
    if not prompts:
        raise ValueError("run needs at least one prompt")
    check_categories(prompts)
    for value, what in ((batch_size, "batch_size"), (reps, "reps"),
                        (max_new_tokens, "max_new_tokens"), (cost_reps, "cost_reps")):
        if not isinstance(value, int | np.integer) or value < 1:
            raise ValueError(f"{what} must be a positive integer, got {value!r}")
    if not isinstance(sampling, SamplingConfig):
        raise TypeError(f"sampling must be one SamplingConfig for the run, got "
                        f"{type(sampling).__name__}")
    for method in methods:
        if method.speculative:
            try:
                speculative_config(None if drafters_tree(method.drafter, method.tree)
                                   is not None else method.num_draft_tokens, sampling,
                                   method.tree, method.drafter, method.verification)
                method.drafter.check(target, sampling)
            except (ValueError, TypeError) as error:
                raise type(error)(f"method {method.name!r}: {error}") from None
    for prompt in prompts:
        if target.max_seq_len is not None and len(prompt.ids) + max_new_tokens > \
                target.max_seq_len:
            raise ValueError(f"prompt {prompt.name or '(unnamed)'} ({prompt.category}) has "
                             f"{len(prompt.ids)} tokens: with max_new_tokens={max_new_tokens} "
                             f"it needs more than the target's max_seq_len="
                             f"{target.max_seq_len} positions; shorten it, leave it out, or "
                             "lower max_new_tokens")
    extra = max(m.verify_nodes() + 1 if m.speculative else 0 for m in methods)
    capacity = plan_capacity(np.array([len(p.ids) for p in prompts]), max_new_tokens,
                             target.max_seq_len, extra_slots=extra)
    settings = _Settings(max_new_tokens, sampling, batch_size, reps, seed, eos_id, capacity)
    units = plan_units(prompts, batch_size)
    done_units, costs = {}, {}
    log = log or (lambda message: warnings.warn(message, stacklevel=3))
    if journal is not None:
        journal = Journal(journal)
        header = fingerprint(target, methods, prompts, settings)
        if resume:
            done_units, costs = journal.resume(header, log)
        else:
            journal.start(header)
    # (method, unit shape) -> "here" (compiled in this process) or "journal" (its compile
    # seconds are in a resumed unit: warmed up again here, not counted twice).
    compiled = {(m.name, unit_shape(prompts, unit)): "journal" for m in methods
                for index, unit in enumerate(units) if str(index) in done_units}
    if done_units and progress is not None:
        progress(len(done_units), len(units), _running_speedups(done_units, methods))
    for index, unit in enumerate(units):
        measured = str(index) not in done_units
        if measured:
            record = measure_unit(target, methods, [prompts[i] for i in unit], settings,
                                  compiled)
            done_units[str(index)] = record
            if journal is not None:
                journal.append({"unit": str(index), "record": record})
        # Each method's costs once, on the first unit (again after a resume that lacks them).
        for method in methods:
            if method.speculative and method.name not in costs:
                costs[method.name] = measure_costs(target, method,
                                                   [list(prompts[i].ids) for i in units[0]],
                                                   settings, cost_reps)
                if journal is not None:
                    journal.append({"method": method.name, "costs": costs[method.name]})
        if measured and progress is not None:
            progress(len(done_units), len(units), _running_speedups(done_units, methods))
    return summarise(methods=methods, prompts=prompts, units=units,
                     records=[done_units[str(i)] for i in range(len(units))], costs=costs,
                     settings={"max_new_tokens": max_new_tokens, "sampling": dataclasses.asdict(
                         sampling), "batch_size": batch_size, "reps": reps, "seed": seed,
                         "cache_size": capacity},
                     bootstrap_samples=bootstrap_samples)


def _running_speedups(records: dict, methods: Sequence[BenchMethod]) -> dict:
    def rate(name):
        tokens = sum(r[name]["tokens"] for r in records.values())
        seconds = sum(r[name]["median_seconds"] for r in records.values())
        return tokens / seconds if seconds > 0 else float("nan")

    plain = rate(PLAIN)
    return {m.name: rate(m.name) / plain for m in methods if m.speculative}
