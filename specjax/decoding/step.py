"""Speculative decoding: draft K tokens, verify K+1 positions in ONE target forward, accept
the longest valid prefix per row with exact rejection sampling.

Invariants of `SpeculativeState` (shared with `generate`): `sequence[b, :lengths[b]]` are
row b's committed tokens (prompt, then generated); the target cache holds all of them but
the last, which is fed first in the next verify forward (`cache_lengths = lengths - 1`).
Rows advance by their own number of tokens; a batch is never advanced by the minimum.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jaxtyping import Bool, Int, Key

from specjax.decoding.branches import run_one_of, verify_widths
from specjax.decoding.sampling import (
    GREEDY,
    SamplingConfig,
    SamplingParams,
    distinct_configs,
    probabilities,
    row_keys,
    sample_from_probs,
    sampling_params,
)
from specjax.decoding.step_counters import advance_counters
from specjax.drafters.base import Commit, DraftContext, Proposal, check_proposal, drafter_key
from specjax.lm.causal_lm import CausalLM
from specjax.runtime.sharding import pin_rows
from specjax.runtime.xla_options import options_jit
from specjax.trees.shapes import DynamicTree, TreeBudget, TreeShape, ancestor_mask, tree_depths
from specjax.verification.rejection import accept_greedy
from specjax.verification.rules import (
    Verification,
    offered_drafts,
    resolve_verification,
    verify_chain,
    verify_tree,
)
from specjax.verification.tree_acceptance import accept_tree_greedy


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpeculativeConfig:
    """Settings of a speculative step (frozen, hashable).

    num_draft_tokens: N, the nodes verified per target forward (K for a chain).
    sampling: a `SamplingConfig` for every row, or a tuple of one per row. Its values are
      data: `jitted_step` passes them to the compiled step as `SamplingParams`, so a new
      temperature, top-k or top-p compiles nothing (only "every row greedy" does).
    tree: a static `TreeShape` of N nodes (drafters then propose that tree), a
      `DynamicTree` budget of N nodes (drafters grow a tree per row and return its
      parents), a `TreeBudget` (a drafter that builds its own tree per row by its own
      rule: retrieval, lookahead), or None for a chain of K drafts (the fast path).
    verification: the rule that decides what a step keeps (specjax.verification): "block"
      (chains), "traversal", "token", or `TypicalAcceptance(...)` (NOT exact); None takes
      the best exact rule for the shape ("block" for a chain, "traversal" for a tree).
    """

    num_draft_tokens: int
    sampling: SamplingConfig | tuple[SamplingConfig, ...] = SamplingConfig()
    tree: TreeShape | DynamicTree | TreeBudget | None = None
    verification: Verification | None = None

    def __post_init__(self):
        k = self.num_draft_tokens
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"num_draft_tokens must be an int >= 1, got {k!r}")
        object.__setattr__(self, "num_draft_tokens", int(k))
        if not isinstance(self.sampling, SamplingConfig):
            distinct_configs(self.sampling)  # a per-row sequence: its types are checked
            object.__setattr__(self, "sampling", tuple(self.sampling))
        if self.tree is not None:
            if not isinstance(self.tree, (TreeShape, DynamicTree, TreeBudget)):
                raise TypeError(f"tree must be a specjax.trees.TreeShape, DynamicTree or "
                                f"TreeBudget, got "
                                f"{type(self.tree).__name__}")
            if self.tree.num_nodes != self.num_draft_tokens:
                raise ValueError(f"the tree has {self.tree.num_nodes} nodes but "
                                 f"num_draft_tokens={self.num_draft_tokens}: a tree step "
                                 "verifies every node, so pass num_draft_tokens="
                                 f"{self.tree.num_nodes}")
        object.__setattr__(self, "verification",
                           resolve_verification(self.verification, self.tree))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SpeculativeState:
    """Everything that changes during speculative decoding (one pytree, donated).

    sequence int32 [B, S]; lengths, prompt_lengths int32 [B]; target_cache; drafter_state;
    done bool [B]; key (the one PRNG key); max_new_tokens int32 scalar and eos_ids int32
    [E] (traced: new values do not recompile; -1 entries are no EOS). Counters per row,
    int32: target_forwards, draft_forwards, proposed, checked (drafts up to and
    including the first rejection), accepted, accepted_per_position [B, K] (steps whose
    accepted path holds node j), accepted_length_counts [B, K+1] (steps that accepted d
    nodes, d = 0..K; for a tree, the accepted depth). Last step, per row:
    step_accepted (drafts accepted), step_emitted (tokens committed). num_steps: verify
    forwards run for the batch.
    """

    sequence: Int[Array, "B S"]
    lengths: Int[Array, " B"]
    prompt_lengths: Int[Array, " B"]
    target_cache: Any
    drafter_state: Any
    done: Bool[Array, " B"]
    key: Key[Array, ""]
    max_new_tokens: Int[Array, ""]
    eos_ids: Int[Array, " E"]
    target_forwards: Int[Array, " B"]
    draft_forwards: Int[Array, " B"]
    proposed: Int[Array, " B"]
    checked: Int[Array, " B"]
    accepted: Int[Array, " B"]
    accepted_per_position: Int[Array, "B K"]
    accepted_length_counts: Int[Array, "B K+1"]
    step_accepted: Int[Array, " B"]
    step_emitted: Int[Array, " B"]
    num_steps: Int[Array, ""]

    @property
    def num_generated(self) -> Array:
        return self.lengths - self.prompt_lengths

    @property
    def num_draft_tokens(self) -> int:
        """The K this state was built for (its counters and scratch slots have that size)."""
        return self.accepted_per_position.shape[1]


def check_config_matches_state(state: SpeculativeState, config: SpeculativeConfig) -> None:
    """Refuse (at trace time) a step whose K differs from the K the state was built for:
    its per-position counters have K columns and its caches reserve K + 1 scratch slots."""
    built_for = state.num_draft_tokens
    if config.num_draft_tokens != built_for:
        raise ValueError(
            f"this SpeculativeState was built for num_draft_tokens={built_for}, but the "
            f"SpeculativeConfig asks for {config.num_draft_tokens}; step it with "
            f"SpeculativeConfig(num_draft_tokens={built_for}, ...), or build a new state with "
            f"init_speculative_state(..., num_draft_tokens={config.num_draft_tokens})")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Verdict:
    """What acceptance decided, per row: `path` int32 [B, D] the accepted nodes in order
    (-1 after), `num_accepted` int32 [B], `emitted` int32 [B, D+1] the accepted tokens then
    the correction or bonus token (at index num_accepted)."""

    path: Int[Array, "B D"]
    num_accepted: Int[Array, " B"]
    emitted: Int[Array, "B D+1"]


def propose(drafter, state: SpeculativeState, key: Array, config: SpeculativeConfig,
            target: CausalLM, sampling: SamplingParams) -> tuple[object, Proposal, Any]:
    """(a) The drafter's proposal, checked against the contract. Returns `(drafter_state,
    proposal, target_cache)`: a drafter that drafts with the target itself
    (`drafts_with_target`, self-speculation) also gets the target and its cache, and may
    write keys and values in the cache's slots from the last committed token on, which
    the verify forward overwrites before anything reads them."""
    vocab_size = target.vocab_size
    extra = {} if config.tree is None else {"tree": config.tree}
    context = DraftContext(state.sequence, state.lengths)
    target_cache = state.target_cache
    if getattr(drafter, "drafts_with_target", False):
        drafter_state, proposal, target_cache = drafter.propose(
            state.drafter_state, context, key, num_draft_tokens=config.num_draft_tokens,
            sampling=sampling, vocab_size=vocab_size, target=target,
            target_cache=target_cache, **extra)
    else:
        drafter_state, proposal = drafter.propose(
            state.drafter_state, context, key, num_draft_tokens=config.num_draft_tokens,
            sampling=sampling, vocab_size=vocab_size, **extra)
    check_proposal(drafter, proposal, state.lengths.shape[0], config.num_draft_tokens,
                   vocab_size, tree=config.tree)
    parents = None if proposal.parents is None else proposal.parents.astype(jnp.int32)
    return drafter_state, dataclasses.replace(
        proposal, tokens=proposal.tokens.astype(jnp.int32), parents=parents), target_cache


def tree_parents(proposal: Proposal, config: SpeculativeConfig) -> Array:
    """int32 [B, N]: the proposal's tree (the static tree's parents, or each row's own for a
    `DynamicTree` or `TreeBudget`)."""
    if config.tree.per_row:
        return proposal.parents
    return config.tree.parents_array(proposal.tokens.shape[0])


def feature_layers_of(drafter) -> tuple[int, ...] | None:
    """None for a drafter that reads no target features; else the layers whose incoming
    residual streams it reads besides the final hidden state (possibly none)."""
    if not getattr(drafter, "reads_target_features", False):
        return None
    return tuple(getattr(drafter, "feature_layers", ()))


def verify(target: CausalLM, state: SpeculativeState, proposal: Proposal,
           config: SpeculativeConfig, feature_layers: tuple[int, ...] = ()):
    """(b) ONE target forward over the last committed token and the N proposed nodes:
    positions are the last position plus each node's depth, and for a tree each token
    attends to its ancestors only. Returns `(logits [B, N+1, V], hidden, cache)`; hidden
    holds the requested features (see `CausalLM.apply`)."""
    lengths_B = state.lengths
    last_token_B = jnp.take_along_axis(state.sequence, lengths_B[:, None] - 1, axis=1)[:, 0]
    tokens_BN1 = jnp.concatenate([last_token_B[:, None], proposal.tokens], axis=1)
    if config.tree is None:
        depths_N1 = jnp.arange(config.num_draft_tokens + 1, dtype=jnp.int32)[None]
        new_mask = None  # causal
    elif config.tree.per_row:
        depths_N1 = jnp.concatenate([jnp.zeros_like(lengths_B)[:, None],
                                     tree_depths(proposal.parents)], axis=1)
        new_mask = ancestor_mask(proposal.parents)
    else:
        depths_N1 = jnp.asarray((0,) + config.tree.depths, jnp.int32)[None]
        new_mask = ancestor_mask(config.tree.parents_array(lengths_B.shape[0]))
    positions_BN1 = (lengths_B - 1)[:, None] + depths_N1
    return target.apply(tokens_BN1, positions_BN1, state.target_cache, lengths_B - 1,
                        new_mask, feature_layers=feature_layers)


def accept(keys: tuple[Array, Array], proposal: Proposal, logits_BN1V: Array,
           config: SpeculativeConfig, sampling: SamplingParams) -> Verdict:
    """(c, d) Acceptance under `config.verification`: the accepted prefix of a chain, or
    path of a tree, then the correction or bonus token. An all-greedy batch takes the
    argmax rules; otherwise a greedy row's p is its argmax one-hot, under which every
    rule accepts exactly the drafts equal to the argmax and emits the argmax."""
    if config.tree is None:
        # A row that offers fewer drafts (`num_real`) than the step verifies accepts only
        # those: a chain of its own length, so the stats count the drafts offered.
        limit_B = offered_drafts(proposal, config.num_draft_tokens)
        if sampling.greedy:
            linear = accept_greedy(proposal.tokens, logits_BN1V, limit_B)
        else:
            linear = verify_chain(config.verification, keys, proposal.tokens, proposal.q,
                                  probabilities(logits_BN1V, sampling), limit_B)
        num_draft = config.num_draft_tokens
        path_BK = jnp.where(linear.accepted, jnp.arange(num_draft, dtype=jnp.int32)[None], -1)
        num_accepted_B, next_B = linear.num_accepted, linear.next_token
    else:
        bounds = {"max_depth": config.tree.max_depth,
                  "max_branching": config.tree.max_branching,
                  "never_accept_BN": proposal.never_accept}
        parents_BN = tree_parents(proposal, config)
        if sampling.greedy:
            walk = accept_tree_greedy(proposal.tokens, parents_BN, logits_BN1V, **bounds)
        else:
            walk = verify_tree(config.verification, keys, proposal.tokens, parents_BN,
                               probabilities(logits_BN1V, sampling), proposal.q, **bounds)
        path_BK, num_accepted_B, next_B = walk.path, walk.num_accepted, walk.next_token
    width = path_BK.shape[1]
    path_tokens_BK = jnp.take_along_axis(proposal.tokens, jnp.maximum(path_BK, 0), axis=1)
    index_K1 = jnp.arange(width + 1, dtype=jnp.int32)[None]
    padded_BK1 = jnp.concatenate([path_tokens_BK, path_tokens_BK[:, :1]], axis=1)
    emitted_BK1 = jnp.where(index_K1 < num_accepted_B[:, None], padded_BK1, next_B[:, None])
    return Verdict(path_BK, num_accepted_B, emitted_BK1)


def _pad_verdict(verdict: Verdict, hidden, target_tokens, path_width: int, nodes: int):
    """A verdict, hidden states and target tokens over fewer positions padded to a path of
    `path_width` nodes and `nodes` + 1 verified positions (nothing past the verified part
    is accepted; hidden states there are 0, target tokens -1)."""
    batch, verified = verdict.path.shape
    extra = path_width - verified
    path = jnp.concatenate([verdict.path, jnp.full((batch, extra), -1, jnp.int32)], axis=1)
    emitted = jnp.concatenate([verdict.emitted, jnp.broadcast_to(
        verdict.emitted[:, -1:], (batch, extra))], axis=1)
    extra_positions = nodes + 1 - hidden.shape[1]
    pad = [(0, 0), (0, extra_positions)] + [(0, 0)] * (hidden.ndim - 2)
    if target_tokens is not None:
        target_tokens = jnp.pad(target_tokens, [(0, 0), (0, extra_positions)],
                                constant_values=-1)
    return Verdict(path, verdict.num_accepted, emitted), jnp.pad(hidden, pad), target_tokens


def _argmax_tokens(logits_BTV: Array, wanted: bool) -> Array | None:
    return jnp.argmax(logits_BTV, axis=-1).astype(jnp.int32) if wanted else None


def verify_and_accept(target: CausalLM, state: SpeculativeState, proposal: Proposal,
                      config: SpeculativeConfig, sampling: SamplingParams,
                      keys: tuple[Array, Array], feature_layers: tuple[int, ...],
                      widths: tuple[int, ...] = (), target_tokens: bool = False):
    """(b, c, d) Verify the proposal in one target forward and accept exactly. Returns
    `(verdict, hidden, target_tokens, target_cache, verified)`: `target_tokens` int32
    [B, N+1] is the target's argmax at each verified position (-1 where not verified),
    computed only when asked for (`target_tokens=True`; else None),
    `verified` (int32 scalar) the number of drafts the step verified. With
    `Proposal.num_real`, it is the smallest of `widths` (see `verify_widths`) that covers
    every running row's real drafts: the step verifies only the first `verified` drafts of
    a chain (a chain of that many, drawn as every chain is, so the acceptance stays exact),
    and with 0 it runs a one-token forward: the next token is drawn from the target at the
    last committed token, as plain decoding does. A tree step verifies all N nodes or
    none."""
    num_drafts = proposal.tokens.shape[1]
    path_width = num_drafts if config.tree is None else config.tree.max_depth

    def full(cache):
        logits_BN1V, hidden, target_cache = verify(
            target, dataclasses.replace(state, target_cache=cache), proposal, config,
            feature_layers)
        return (accept(keys, proposal, logits_BN1V, config, sampling), hidden,
                _argmax_tokens(logits_BN1V, target_tokens), target_cache)

    if proposal.num_real is None:  # static: drafters that always offer real drafts
        return *full(state.target_cache), jnp.int32(num_drafts)

    def first(width: int):
        """Verify and accept the first `width` drafts of a chain, or nodes of a tree whose
        real nodes come first, only (0 < width < N)."""
        cut = lambda a: None if a is None else a[:, :width]

        def run(cache):
            shorter = Proposal(tokens=proposal.tokens[:, :width], q=cut(proposal.q),
                               never_accept=cut(proposal.never_accept),
                               parents=cut(proposal.parents), num_real=proposal.num_real)
            tree = config.tree
            if tree is not None:
                tree = TreeBudget(num_nodes=width, max_depth=min(tree.max_depth, width),
                                  max_branching=tree.max_branching)
            short_config = dataclasses.replace(config, num_draft_tokens=width, tree=tree)
            logits, hidden, target_cache = verify(
                target, dataclasses.replace(state, target_cache=cache), shorter, short_config,
                feature_layers)
            padded = _pad_verdict(accept(keys, shorter, logits, short_config, sampling),
                                  hidden, _argmax_tokens(logits, target_tokens), path_width,
                                  num_drafts)
            return *padded, target_cache

        return run

    def narrow(cache):
        lengths_B = state.lengths
        last_B1 = jnp.take_along_axis(state.sequence, lengths_B[:, None] - 1, axis=1)
        logits_B1V, hidden_B1, target_cache = target.apply(
            last_B1, (lengths_B - 1)[:, None], cache, lengths_B - 1, None,
            feature_layers=feature_layers)
        if sampling.greedy:
            next_B = jnp.argmax(logits_B1V[:, 0], axis=-1).astype(jnp.int32)
        else:
            p_BV = probabilities(logits_B1V[:, 0], sampling)
            next_B = sample_from_probs(row_keys(keys[1], p_BV.shape[0]), p_BV)
        batch = proposal.tokens.shape[0]
        verdict = Verdict(path=jnp.zeros((batch, 0), jnp.int32),
                          num_accepted=jnp.zeros((batch,), jnp.int32),
                          emitted=next_B[:, None])
        padded = _pad_verdict(verdict, hidden_B1, _argmax_tokens(logits_B1V, target_tokens),
                              path_width, num_drafts)
        return *padded, target_cache

    widths = widths or (0, num_drafts)
    branches = [narrow if w == 0 else full if w == num_drafts else first(w) for w in widths]
    needed = jnp.max(jnp.where(state.done, 0, jnp.clip(proposal.num_real, 0, num_drafts)))
    # The smallest listed width >= needed (the last, N, covers every row).
    index = jnp.sum(jnp.asarray(widths, jnp.int32) < needed)
    verdict, hidden, target_tokens, target_cache = run_one_of(index, branches,
                                                              state.target_cache)
    return verdict, hidden, target_tokens, target_cache, jnp.asarray(widths, jnp.int32)[index]


def emit(state: SpeculativeState, verdict: Verdict):
    """(e) Each row commits its own number of tokens, cut at an EOS and at max_new_tokens.
    Returns `(sequence, new_lengths, num_emitted, done)`."""
    lengths_B, active_B = state.lengths, ~state.done
    emitted_BK1 = verdict.emitted
    index_K1 = jnp.arange(emitted_BK1.shape[1], dtype=jnp.int32)[None]
    num_emitted_B = jnp.minimum(verdict.num_accepted + 1,
                                state.max_new_tokens - (lengths_B - state.prompt_lengths))
    matches_eos_BK1 = jnp.any(emitted_BK1[:, :, None] == state.eos_ids[None, None, :], axis=2)
    is_eos_BK1 = matches_eos_BK1 & (index_K1 < num_emitted_B[:, None])
    hit_eos_B = jnp.any(is_eos_BK1, axis=1)
    num_emitted_B = jnp.where(hit_eos_B, jnp.argmax(is_eos_BK1, axis=1) + 1, num_emitted_B)
    num_emitted_B = jnp.where(active_B, num_emitted_B, 0).astype(jnp.int32)

    write = lambda row_S, new_K1, start: jax.lax.dynamic_update_slice(row_S, new_K1, (start,))
    written = jax.vmap(write)(state.sequence, emitted_BK1, lengths_B)
    # Only emitted slots change; the rest of the write (and finished rows) keeps old values.
    slot_S = jnp.arange(state.sequence.shape[1], dtype=jnp.int32)[None]
    keep_new = (slot_S >= lengths_B[:, None]) & (slot_S < (lengths_B + num_emitted_B)[:, None])
    sequence = jnp.where(keep_new, written, state.sequence)
    new_lengths_B = lengths_B + num_emitted_B
    done_B = state.done | (active_B & hit_eos_B) | (
        new_lengths_B - state.prompt_lengths >= state.max_new_tokens)
    return sequence, new_lengths_B, num_emitted_B, done_B


def speculative_step(target: CausalLM, drafter, state: SpeculativeState,
                     config: SpeculativeConfig,
                     sampling: SamplingParams | None = None) -> SpeculativeState:
    """One speculative step for every row still running (pure; jit with `config` static).

    `sampling`: the per-row settings as traced data (`specjax.decoding.sampling.sampling_params`);
    None takes `config.sampling`, whose values then become constants of the trace (jit it
    with `sampling` passed as an argument, as `jitted_step` does, to change settings
    without recompiling).

    (a) propose: the drafter proposes N nodes per row (a chain of K drafts, or a tree);
    (b) verify: the target runs ONCE on the last committed token plus the N nodes (or
        the first few of a chain, down to the last token alone, when the running rows'
        real drafts, `Proposal.num_real`, are fewer);
    (c, d) accept: exact acceptance for all rows at once, then the correction or bonus;
    (e) emit: each row commits its own number of tokens (cut at EOS and max_new_tokens);
    commit: a tree's accepted path moves to contiguous cache slots, the drafter hears the
    outcome, and the counters advance. Caches roll back by length.
    """
    check_config_matches_state(state, config)
    batch = state.lengths.shape[0]
    sampling = sampling_params(config.sampling if sampling is None else sampling, batch)
    key, k_draft, k_accept, k_resample = jax.random.split(state.key, 4)
    active_B = ~state.done
    lengths_B = state.lengths

    drafter_state, proposal, target_cache = propose(drafter, state, k_draft, config, target,
                                                    sampling)
    state = dataclasses.replace(state, target_cache=target_cache)
    verdict, hidden_BN1D, target_tokens_BN1, target_cache, verified = verify_and_accept(
        target, state, proposal, config, sampling, (k_accept, k_resample),
        feature_layers_of(drafter) or (), verify_widths(drafter, config),
        target_tokens=getattr(drafter, "reads_target_tokens", False))
    sequence, new_lengths_B, num_emitted_B, done_B = emit(state, verdict)
    num_accepted_B = verdict.num_accepted
    if config.tree is not None and not config.tree.is_chain:
        # Node i was written at slot lengths + i; the path's d-th node moves to lengths + d.
        target_cache = target.compact_cache(target_cache, lengths_B,
                                            lengths_B[:, None] + jnp.maximum(verdict.path, 0))

    drafter_state = drafter.commit(drafter_state, Commit(
        old_lengths=lengths_B, new_lengths=new_lengths_B, num_accepted=num_accepted_B,
        sequence=sequence, target_hidden=hidden_BN1D, active=active_B, path=verdict.path,
        target_tokens=target_tokens_BN1))

    forwards = drafter.forwards_per_step(
        config.num_draft_tokens, **({} if config.tree is None else {"tree": config.tree}))
    offered_B = jnp.broadcast_to(verified, (batch,))  # drafts verified for the row
    if config.tree is None and proposal.num_real is not None:
        offered_B = jnp.minimum(offered_drafts(proposal, config.num_draft_tokens), verified)
    counters = advance_counters(state, verdict, offered_B, num_emitted_B, done_B,
                                chain=config.tree is None, draft_forwards=forwards)
    return pin_rows(SpeculativeState(
        sequence=sequence, lengths=new_lengths_B, prompt_lengths=state.prompt_lengths,
        target_cache=target_cache, drafter_state=drafter_state, done=done_B, key=key,
        max_new_tokens=state.max_new_tokens, eos_ids=state.eos_ids, **counters), target,
        batch)


def compile_key(config: SpeculativeConfig, sampling: SamplingParams) -> SpeculativeConfig:
    """The config as a compiled step sees it: its sampling values replaced by what the
    trace depends on (every row greedy, or not), so configs that differ only in their
    sampling values share one compiled program; the values travel as `SamplingParams`."""
    return dataclasses.replace(config, sampling=GREEDY if sampling.greedy else SamplingConfig())


@options_jit(static_argnames=("config", "drafter_type"),
             donate_argnames=("state",))
def compiled_step(target: CausalLM, drafter, state: SpeculativeState,
                  config: SpeculativeConfig, sampling: SamplingParams, *,
                  drafter_type: tuple) -> SpeculativeState:
    """`speculative_step` compiled per (shapes, `config`, the drafter's class): pass
    `compile_key(config, sampling)` as the config, the values as `sampling`, and
    `drafter_key(drafter)`. The class is in the key because JAX's tree structures of a
    registered dataclass and of a subclass with the same fields compare equal (while
    their hashes differ): a subclass that drafts differently could otherwise, now and
    then, be handed its parent's compiled program."""
    del drafter_type
    return speculative_step(target, drafter, state, config, sampling)


def jitted_step(target: CausalLM, drafter, state: SpeculativeState,
                config: SpeculativeConfig) -> SpeculativeState:
    """`speculative_step` compiled once per (shapes, K, tree, every-row-greedy or not); the
    sampling values are passed as data, so a new temperature, top-k or top-p reuses the
    compiled step. The state is donated."""
    if not isinstance(config, SpeculativeConfig):
        raise TypeError(f"config must be a specjax.SpeculativeConfig, got "
                        f"{type(config).__name__}")
    sampling = sampling_params(config.sampling, state.lengths.shape[0])
    return compiled_step(target, drafter, state, compile_key(config, sampling), sampling,
                         drafter_type=drafter_key(drafter))
