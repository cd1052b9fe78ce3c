"""Speculative decoding of whole batches: validate and prefill on the host side, then
run `speculative_step` inside one jit and one `lax.while_loop`.

This is the layer that turns a plain `CausalLM` draft into a `DraftModel`; the step
itself (specjax.decoding.step) knows only the drafter contract.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from specjax.decoding.inputs import (
    check_pad_id,
    count_rows,
    first_columns,
    first_rows,
    prepare_batch,
    resolve_key,
    running_rows,
    settings_for_padded_rows,
)
from specjax.decoding.sampling import (
    SamplingConfig,
    SamplingParams,
    distinct_configs,
    sampling_params,
)
from specjax.decoding.stats import SpeculativeStats
from specjax.decoding.step import (
    SpeculativeConfig,
    SpeculativeState,
    compile_key,
    feature_layers_of,
    speculative_step,
)
from specjax.drafters.base import drafter_key, warn_beyond_training
from specjax.drafters.draft_model import DraftModel
from specjax.lm.causal_lm import CausalLM, prefill
from specjax.runtime.background_compile import placed_as_outputs, while_compiling
from specjax.runtime.distributed import process_local
from specjax.runtime.sharding import pin_rows
from specjax.runtime.xla_options import options_jit
from specjax.trees.shapes import DynamicTree, TreeBudget, TreeShape
from specjax.verification.rules import Verification, rule_that_ran


def as_drafter(draft):
    """A CausalLM becomes `DraftModel(draft, method="sample")`; drafters pass through."""
    if isinstance(draft, CausalLM):
        return DraftModel(draft, method="sample")
    for name in ("check", "init", "propose", "commit", "forwards_per_step"):
        if not callable(getattr(draft, name, None)):
            raise TypeError(f"draft must be a specjax.CausalLM or a drafter (see "
                            f"specjax.drafters.Drafter); {type(draft).__name__} has no {name}()")
    leaves = jax.tree.leaves(draft)
    if any(not isinstance(leaf, (jax.Array, np.ndarray, np.generic)) for leaf in leaves):
        raise TypeError(f"the drafter {type(draft).__name__} is not a JAX pytree of arrays, so "
                        "it cannot enter the jitted step: register its class with "
                        "jax.tree_util.register_dataclass (arrays as data fields, settings as "
                        "static meta_fields) or register_pytree_node_class")
    return draft



@options_jit(static_argnames=("capacity", "num_draft_tokens", "drafter_type"))
def _init_state(target: CausalLM, drafter, prompt_tokens_BP: Array, prompt_lengths_B: Array,
                key: Array, max_new_tokens: Array, eos_ids: Array, running_B: Array, *,
                capacity: int,
                num_draft_tokens: int, drafter_type: tuple) -> SpeculativeState:
    del drafter_type  # in the compile key only (see step.compiled_step)
    batch, width = prompt_tokens_BP.shape
    cache = target.init_cache(batch, capacity)
    layers = feature_layers_of(drafter)
    cache, _, _, features = prefill(target, cache, prompt_tokens_BP, prompt_lengths_B,
                                    feature_layers=layers or (),
                                    keep_hidden=layers is not None)
    sequence = jnp.zeros((batch, capacity), jnp.int32).at[:, :width].set(prompt_tokens_BP)
    zeros = jnp.zeros((batch,), jnp.int32)
    return pin_rows(SpeculativeState(
        sequence=sequence, lengths=prompt_lengths_B, prompt_lengths=prompt_lengths_B,
        target_cache=cache,
        drafter_state=drafter.init(prompt_tokens_BP, prompt_lengths_B, capacity,
                                   **({} if layers is None else {"features": features}),
                                   **({"num_draft_tokens": num_draft_tokens}
                                      if getattr(drafter, "init_takes_draft_tokens", False)
                                      else {})),
        done=~running_B, key=key, max_new_tokens=max_new_tokens,  # padding rows: done
        eos_ids=eos_ids, target_forwards=zeros, draft_forwards=zeros, proposed=zeros,
        checked=zeros, accepted=zeros,
        accepted_per_position=jnp.zeros((batch, num_draft_tokens), jnp.int32),
        accepted_length_counts=jnp.zeros((batch, num_draft_tokens + 1), jnp.int32),
        step_accepted=zeros, step_emitted=zeros, num_steps=jnp.zeros((), jnp.int32)),
        target, batch)


def drafters_tree(draft, tree):
    """The tree a step verifies: the one given, or, for a drafter that builds its own tree
    per row (`proposal_tree`, a `TreeBudget`: lookahead, retrieval), that budget; a
    different tree for such a drafter is refused."""
    own = getattr(draft, "proposal_tree", None)
    if own is None:
        return tree
    if tree is not None and tree != own:
        raise ValueError(f"{type(draft).__name__} builds its own tree per row within {own}; "
                         "pass tree=None (decoding then takes the drafter's own), or "
                         "change the drafter's settings")
    return own


def speculative_config(num_draft_tokens: int | None, sampling,
                       tree: TreeShape | DynamicTree | TreeBudget | None,
                       draft=None, verification: Verification | None = None
                       ) -> SpeculativeConfig:
    """The step's config; with a tree, num_draft_tokens defaults to its nodes; a drafter
    with its own tree (`proposal_tree`) brings it."""
    tree = drafters_tree(draft, tree)
    if num_draft_tokens is None:
        if tree is None:
            raise TypeError("num_draft_tokens is required (or pass tree=TreeShape(...) or "
                            "DynamicTree(...))")
        num_draft_tokens = tree.num_nodes
    return SpeculativeConfig(num_draft_tokens=num_draft_tokens, sampling=sampling, tree=tree,
                             verification=verification)


def check_tree_support(target: CausalLM, drafter,
                       tree: TreeShape | DynamicTree | TreeBudget | None) -> None:
    """Refuse, on the host, a tree that the drafter cannot draft or the target cannot
    compact."""
    if tree is None:
        return
    if isinstance(tree, TreeBudget) and getattr(drafter, "proposal_tree", None) != tree:
        raise ValueError(f"a TreeBudget is the tree of a drafter that builds its own per row "
                         f"(specjax.drafters.Lookahead, Retrieval); {type(drafter).__name__} "
                         "does not: pass a TreeShape or DynamicTree")
    if getattr(drafter, "min_confidence", None) is not None:
        raise ValueError(f"{type(drafter).__name__}(min_confidence=...) sets how many drafts "
                         "of a chain each step verifies; a tree step verifies every node "
                         "(a DynamicTree already keeps the likeliest): pass tree=None, or "
                         "min_confidence=None")
    if not getattr(drafter, "drafts_trees", False):
        raise ValueError(f"{type(drafter).__name__} drafts chains only; pass tree=None, or a "
                         "drafter that drafts trees (specjax.DraftModel)")
    if isinstance(tree, DynamicTree):
        if not getattr(drafter, "drafts_dynamic_trees", False):
            raise ValueError(f"{type(drafter).__name__} drafts static trees only; pass a "
                             "TreeShape, or a drafter that grows dynamic trees "
                             "(specjax.DraftModel)")
        if tree.top_k > target.vocab_size:
            raise ValueError(f"DynamicTree(top_k={tree.top_k}) exceeds the target's "
                             f"vocab_size {target.vocab_size}")
    if not tree.is_chain and target.compact_fn is None:
        raise ValueError("the target has no compact_fn, which a token tree needs to move its "
                         "accepted path into contiguous cache slots")


def init_speculative_state(target: CausalLM, draft, prompts, *, max_new_tokens: int,
                           num_draft_tokens: int | None = None,
                           sampling: SamplingConfig | Sequence[SamplingConfig] = (
                               SamplingConfig()),
                           key: Array | None = None,
                           eos_id: int | Sequence[int] | None = None,
                           prompt_lengths=None, cache_size: int | None = None,
                           tree: TreeShape | DynamicTree | None = None,
                           verification: Verification | None = None
                           ) -> tuple[SpeculativeState, Any]:
    """Validate the inputs on the host, then prefill target and drafter.

    `cache_size` pins the slots of the caches and the token buffer; too small a value is
    refused. By default (`specjax.decoding.inputs.plan_capacity`) it is the need, longest prompt +
    max_new_tokens + K + 1 (K the chain's drafts or the tree's N nodes: a step's scratch
    slots), rounded up to a power of two of at least `MIN_CACHE_BUCKET` slots (short
    requests share one compiled decoder), but no more than the target's max_seq_len + K + 1.
    `tree` (a `specjax.trees.TreeShape`) makes every step draft and verify that tree of
    N = tree.num_nodes nodes instead of a chain of K = num_draft_tokens; a
    `specjax.trees.DynamicTree` makes the drafter grow its own tree of N nodes per row.
    `verification` is checked against the proposal shape here (see `speculative_generate`).
    Returns `(state, drafter)`; pass both to `speculative_step` with
    `SpeculativeConfig(num_draft_tokens=..., sampling=..., tree=..., verification=...)`.

    On a data-parallel mesh whose data axis does not divide the batch, the state holds
    padding rows after the caller's (copies of the last prompt, done from the start) up to
    `specjax.decoding.inputs.padded_rows(target, B)`; a per-row sampling list then needs their
    settings too (`specjax.decoding.inputs.settings_for_padded_rows(target, prompts, sampling)`),
    and the caller reads its first B rows.
    """
    state, drafter, _ = _init_speculative_state(
        target, draft, prompts, max_new_tokens=max_new_tokens,
        num_draft_tokens=num_draft_tokens, sampling=sampling, key=key, eos_id=eos_id,
        prompt_lengths=prompt_lengths, cache_size=cache_size, tree=tree,
        verification=verification)
    return state, drafter


# What `_init_speculative_state` has compiled in the background before: (program, config,
# the prefill's argument structure, shapes, dtypes and placements). A repeated request
# skips the background work (1.5 ms of a 4 ms call on a tiny model); after
# `jax.clear_caches()` the set is stale, and the step then compiles in the foreground.
_COMPILED_NEXT: set = set()


def _signature(program, config, args: tuple, static: dict) -> tuple:
    leaves, structure = jax.tree.flatten(args)
    return (program, config, structure, tuple(static.items()),
            tuple((getattr(x, "shape", None), getattr(x, "dtype", type(x)),
                   getattr(x, "sharding", None), getattr(x, "committed", None))
                  for x in leaves))


def _init_speculative_state(target: CausalLM, draft, prompts, *, max_new_tokens: int,
                            num_draft_tokens, sampling, key, eos_id, prompt_lengths,
                            cache_size, tree, verification=None, next_program=None
                            ) -> tuple[SpeculativeState, Any, SpeculativeConfig]:
    """`init_speculative_state`, plus the step's config (its per-row sampling settings
    padded for a mesh's padding rows); with `next_program` (`_speculative_loop` or
    `step.compiled_step`), the program that will take the state under that config is
    lowered and compiled in a background thread while the prefill compiles and runs
    (`specjax.runtime.background_compile`), the first time these shapes come."""
    config, drafter, prefill_args, prefill_static, batch = prefill_inputs(
        target, draft, prompts, max_new_tokens=max_new_tokens,
        num_draft_tokens=num_draft_tokens, sampling=sampling, key=key, eos_id=eos_id,
        prompt_lengths=prompt_lengths, cache_size=cache_size, tree=tree,
        verification=verification)
    compile_next = None
    if next_program is not None:
        program = next_program
        # Keyed as the program is compiled: by the sampling values' compile key, so a new
        # temperature, top-k or top-p finds its program compiled.
        params = sampling_params(config.sampling, len(batch.lengths))
        step_key = compile_key(config, params)
        signature = _signature(program, step_key, prefill_args, prefill_static)
        # The prefill's trace, shared with its call below: only the shapes are needed.
        shapes = None if signature in _COMPILED_NEXT else placed_as_outputs(
            _init_state.eval_shape(*prefill_args, **prefill_static), prefill_args)
        if shapes is not None:

            def compile_next():
                program.lower(target, drafter, shapes, step_key, params,
                              drafter_type=drafter_key(drafter)).compile()
                _COMPILED_NEXT.add(signature)
    state = while_compiling(compile_next, lambda: _init_state(*prefill_args, **prefill_static))
    return state, drafter, config


def prefill_inputs(target: CausalLM, draft, prompts, *, max_new_tokens: int, num_draft_tokens,
                   sampling, key, eos_id, prompt_lengths, cache_size, tree,
                   verification=None):
    """The checked inputs of a speculative decoder's prefill program (`_init_state`):
    `(config, drafter, prefill_args, prefill_static, batch)`, every host-side check made
    (`specjax.portability` lowers the programs from them without running any)."""
    sampling = settings_for_padded_rows(target, prompts, sampling)
    config = speculative_config(num_draft_tokens, sampling, tree, draft, verification)
    tree = config.tree
    drafter = as_drafter(draft)
    if hasattr(drafter, "placed_like"):  # a draft model follows its target onto a mesh
        drafter = drafter.placed_like(target)
    check_tree_support(target, drafter, tree)
    batch, capacity, eos_ids = prepare_batch(target, prompts, prompt_lengths, max_new_tokens,
                                             sampling, eos_id,
                                             extra_slots=config.num_draft_tokens + 1,
                                             cache_size=cache_size)
    for row_sampling in distinct_configs(sampling):
        drafter.check(target, row_sampling)
    warn_beyond_training(drafter, config.num_draft_tokens,
                         int(np.max(batch.lengths)) + max_new_tokens)
    prefill_args = (target, drafter, jnp.asarray(batch.tokens), jnp.asarray(batch.lengths),
                    resolve_key(key, sampling), jnp.int32(max_new_tokens), jnp.asarray(eos_ids),
                    running_rows(batch))
    prefill_static = dict(capacity=capacity, num_draft_tokens=config.num_draft_tokens,
                          drafter_type=drafter_key(drafter))
    return config, drafter, prefill_args, prefill_static, batch



@options_jit(static_argnames=("config", "drafter_type"),
             donate_argnames=("state",))
def _speculative_loop(target: CausalLM, drafter, state: SpeculativeState,
                      config: SpeculativeConfig, sampling: SamplingParams, *,
                      drafter_type: tuple) -> SpeculativeState:
    # `config` is `compile_key(...)`: its sampling values are in `sampling` (data).
    del drafter_type  # in the compile key only (see step.compiled_step)
    return jax.lax.while_loop(
        lambda s: ~jnp.all(s.done),
        lambda s: speculative_step(target, drafter, s, config, sampling), state)


@jax.jit
def _generated_tokens(state: SpeculativeState, pad_id: Array) -> Array:
    """int32 [B, S]: each row's generated tokens from slot 0, pad after its end."""
    index_BS = state.prompt_lengths[:, None] + jnp.arange(state.sequence.shape[1],
                                                          dtype=jnp.int32)[None]
    last_slot = state.sequence.shape[1] - 1
    tokens_BS = jnp.take_along_axis(state.sequence, jnp.minimum(index_BS, last_slot), axis=1)
    return jnp.where(index_BS < state.lengths[:, None], tokens_BS, pad_id)


def start_decoding(target: CausalLM, draft, prompts, *, max_new_tokens: int,
                   num_draft_tokens, sampling, key, eos_id, prompt_lengths, pad_id,
                   cache_size, tree, verification=None, program=None):
    """What `speculative_generate` and `speculative_stream` do before their first step:
    `(config, pad_id, state, drafter)`, every input checked and both models prefilled.

    `program` (`_speculative_loop` or `step.compiled_step`): the jitted program the
    caller runs next, as `program(target, drafter, state, compile_key(config, params),
    params, drafter_type=...)`; it is compiled while the prefill runs."""
    pad_id = check_pad_id(pad_id)
    state, drafter, config = _init_speculative_state(
        target, draft, prompts, max_new_tokens=max_new_tokens,
        num_draft_tokens=num_draft_tokens, sampling=sampling, key=key, eos_id=eos_id,
        prompt_lengths=prompt_lengths, cache_size=cache_size, tree=tree,
        verification=verification, next_program=program)
    return config, pad_id, state, drafter


@dataclasses.dataclass(frozen=True)
class SpeculativeOutput:
    """`tokens` int32 [B, max_new_tokens] and `lengths` int32 [B] exactly as `generate`
    returns them, plus `stats` (SpeculativeStats)."""

    tokens: Array
    lengths: Array
    stats: SpeculativeStats


def speculative_generate(target: CausalLM, draft, prompts, *, max_new_tokens: int,
                         num_draft_tokens: int | None = None,
                         sampling: SamplingConfig | Sequence[SamplingConfig] = (
                             SamplingConfig()),
                         key: Array | None = None,
                         eos_id: int | Sequence[int] | None = None,
                         prompt_lengths=None, pad_id: int = 0,
                         cache_size: int | None = None,
                         tree: TreeShape | DynamicTree | None = None,
                         verification: Verification | None = None) -> SpeculativeOutput:
    """Speculative decoding of a batch of prompts in one jit and one `lax.while_loop`.

    Args:
      target: the model whose distribution the output follows exactly.
      draft: a CausalLM sharing the target's tokenizer (wrapped as
        `DraftModel(draft, method="sample")`) or any drafter.
      prompts, prompt_lengths, max_new_tokens, sampling, key, eos_id, pad_id: as in
        `specjax.generate`; `max_new_tokens`, `eos_id` and the sampling values are traced
        (one `SamplingConfig`, or one per row: rows may mix greedy and sampled settings).
      num_draft_tokens: K, the drafts verified per target forward (with a tree: its nodes,
        the default).
      cache_size: optional fixed cache length (see `init_speculative_state`).
      tree: a static `specjax.trees.TreeShape` (e.g. `TreeShape.from_paths([[0], [1],
        [0, 0]])`): each step drafts that tree and verifies all its nodes in one forward;
        or a `specjax.trees.DynamicTree(num_nodes, max_depth, top_k)`: each step the
        drafter grows an EAGLE-2 tree of that budget per row. The drafter must draft
        trees (`DraftModel` does both).
      verification: the rule that decides what each step keeps (`specjax.verification`):
        "block" (block verification, chains only), "traversal" (its tree form; on a
        chain, block verification), "token" (token-level rejection sampling: the rule of
        earlier releases, to reproduce an older seeded run), or
        `specjax.TypicalAcceptance(epsilon, delta)`, which is NOT exact. None (default):
        the exact rule that accepts the most for the shape, "block" for a chain and
        "traversal" for a tree. Greedy rows give the same tokens under every rule.

    Returns:
      `SpeculativeOutput(tokens [B, max_new_tokens], lengths [B], stats)`. A block that
      overshoots `max_new_tokens` is cut; an EOS inside an accepted block ends the row there.
    """
    config, pad_id, state, drafter = start_decoding(
        target, draft, prompts, max_new_tokens=max_new_tokens,
        num_draft_tokens=num_draft_tokens, sampling=sampling, key=key, eos_id=eos_id,
        prompt_lengths=prompt_lengths, pad_id=pad_id, cache_size=cache_size, tree=tree,
        verification=verification, program=_speculative_loop)
    params = sampling_params(config.sampling, state.lengths.shape[0])
    state = _speculative_loop(target, drafter, state, compile_key(config, params), params,
                              drafter_type=drafter_key(drafter))
    rows = count_rows(prompts)  # the caller's; a mesh's padding rows follow them
    tokens = first_columns(_generated_tokens(state, jnp.int32(pad_id)), max_new_tokens, rows)
    return SpeculativeOutput(tokens=tokens,
                             lengths=first_rows(process_local(state.num_generated), rows),
                             stats=SpeculativeStats.from_state(
                                 state, rows, rule_that_ran(
                                     config.verification, config.tree, params.greedy)))
