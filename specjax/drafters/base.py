"""The drafter interface (DESIGN.md section 6) shared by the whole method family.

A drafter is a pytree (its model parameters are leaves, its settings static) with its own
state and three pure functions, all called inside the jitted speculative step:

- `init(prompt_tokens[B,P], prompt_lengths[B], capacity) -> state`: once, at prefill.
- `propose(state, context, key, *, num_draft_tokens, sampling, vocab_size)
   -> (state, Proposal)`: K draft tokens per row and the distribution each was drawn from.
   `sampling` is `specjax.decoding.sampling.SamplingParams`: per-row settings as traced arrays
   (the draft warps its logits with `probabilities(logits, sampling)`, one-hot on greedy
   rows) and a static `greedy` (every row greedy: argmax drafting, one-hot q).
   A drafter that drafts token trees sets `drafts_trees = True` and also takes
   `tree=TreeShape` (then it proposes the tree's N nodes in its node order, with q or
   None for deterministic children); `forwards_per_step` takes the same `tree=`. One
   that also grows EAGLE-2 trees sets `drafts_dynamic_trees = True` and takes
   `tree=DynamicTree` (then it returns its own tree per row in `Proposal.parents`;
   `specjax.trees.dynamic_trees.grow_dynamic_tree` does the growing).
- `commit(state, Commit) -> state`: after verification, with every row's accepted count
   and accepted path.

The context gives every drafter the committed token buffer, so model-free drafters
(n-gram lookup, retrieval) need no state, and the commit passes the target's hidden
states of the verified positions, for drafters that read them (Medusa, EAGLE, MTP).

Target features: a drafter with `reads_target_features = True` gets `init(...,
features=...)`, the prefill's hidden states of the prompts, and its `feature_layers`
(static layer indices; `eagle3_feature_layers(L)` gives EAGLE-3's 2, L // 2, L - 3) make
every verify forward also return the residual stream entering those layers, with no
extra forward: hidden is then `[B, T, F + 1, D]` (those layers, then the final hidden
state) in the prefill and in `Commit.target_hidden`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jaxtyping import Bool, Float, Int

from specjax.decoding.sampling import SamplingConfig, SamplingParams
from specjax.lm.causal_lm import CausalLM
from specjax.trees.shapes import DynamicTree, TreeBudget, TreeShape


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DraftContext:
    """What every drafter may read: `sequence` int32 [B, S] holds each row's committed
    tokens (prompt then generated) in slots `[0, lengths[b])`; later slots are scratch."""

    sequence: Int[Array, "B S"]
    lengths: Int[Array, " B"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Proposal:
    """N proposed nodes per row: a chain of K drafts, or the nodes of the step's tree
    (`SpeculativeConfig.tree`, in its node order).

    tokens: int32 [B, N]. q: float32 [B, N, V_target], the distribution each token was
    actually drawn from (for a sampled sibling drawn without replacement, the draft's
    distribution without the earlier siblings), or None when every node is deterministic
    (top-k / argmax / copied: a tree step then accepts x with probability p(x); a chain
    needs the one-hot q). Exactness depends on q being exactly that distribution, over the
    TARGET's vocabulary. never_accept: optional bool [B, N], nodes the target evaluates
    but the walk never accepts (lookahead, adaptive length; trees only). parents: int32
    [B, N], each node's parent (-1 = the last committed token, else an earlier node;
    siblings in draw order), only for a `DynamicTree` step, where each row has its own
    tree (a chain or a static tree's shape is in the config), and for a `TreeBudget` step.
    num_real: optional int32 [B]: how many of the row's leading drafts are worth verifying
    (0 for a row with nothing to offer, e.g. prompt lookup or retrieval without a match,
    whose drafts are filler; fewer than K when a confident drafter doubts its later
    drafts). The step verifies only as many drafts as the running rows need
    (`step.verify_widths`): none, a one-token forward at plain decoding's cost, when no
    row has a real draft; all N otherwise, or, for a chain drafter with
    `graded_num_real = True`, the longest row's count (a tree is verified whole or not).
    The choice depends on the drafts alone, so the output stays exact.
    """

    tokens: Int[Array, "B N"]
    q: Float[Array, "B N V"] | None
    never_accept: Bool[Array, "B N"] | None = None
    parents: Int[Array, "B N"] | None = None
    num_real: Int[Array, " B"] | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Commit:
    """The outcome of one verification, per row.

    old_lengths / new_lengths: int32 [B] committed tokens before and after the step
    (new - old tokens were emitted: the accepted drafts, then the correction or bonus,
    cut at EOS or max_new_tokens). num_accepted: int32 [B] leading drafts accepted.
    sequence: the token buffer after the step. target_hidden: [B, K+1, D] target features
    at the verified positions (last committed token, then the N nodes; [B, N+1, F+1, D]
    when the drafter asks for feature layers; after a one-token step, see
    `Proposal.num_real`, only position 0 is filled, the rest is 0). active: bool [B],
    rows that took part in the step. path: int32 [B, D], the accepted nodes in order (-1
    after the row's num_accepted; for a chain, 0, 1, ...). target_tokens: int32 [B, N+1],
    the target's argmax (its greedy token) at each verified position, the last committed
    token then the N nodes, never-accepted nodes included (what a Jacobi window needs;
    -1 where a narrower step verified nothing), for a drafter with
    `reads_target_tokens = True`; None for the others (no argmax computed).
    """

    old_lengths: Int[Array, " B"]
    new_lengths: Int[Array, " B"]
    num_accepted: Int[Array, " B"]
    sequence: Int[Array, "B S"]
    target_hidden: Float[Array, "B N+1 D"]
    active: Bool[Array, " B"]
    path: Int[Array, "B D"] | None = None
    target_tokens: Int[Array, "B N+1"] | None = None


def eagle3_feature_layers(num_layers: int) -> tuple[int, ...]:
    """The layers whose incoming residual streams EAGLE-3 fuses: 2, L // 2 and L - 3 (low,
    middle and high), kept inside [0, L) and without repeats for shallow models."""
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    wanted = (2, num_layers // 2, num_layers - 3)
    return tuple(sorted({min(max(layer, 0), num_layers - 1) for layer in wanted}))


def draft_vocab_ids(draft_vocab, vocab_size: int) -> Array:
    """A reduced draft vocabulary (EAGLE-3's, or a distilled draft model's) as sorted,
    unique int32 target ids in [0, vocab_size); anything else is refused."""
    ids = np.asarray(draft_vocab)
    if ids.ndim != 1 or ids.size < 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"draft_vocab must be a non-empty 1-D array of target token ids, got "
                         f"{ids.dtype} of shape {ids.shape}")
    unique = np.unique(ids.astype(np.int64))
    if unique.size != ids.size:
        raise ValueError(f"draft_vocab repeats {ids.size - unique.size} ids; each target id "
                         "may be one column of the draft's logits only")
    if unique[0] < 0 or unique[-1] >= vocab_size:
        raise ValueError(f"draft_vocab must hold ids in [0, {vocab_size}) (the target's "
                         f"vocabulary), got [{unique[0]}, {unique[-1]}]")
    return jnp.asarray(unique, jnp.int32)


def scatter_to_vocab(logits_BV: Array, draft_vocab: Array, vocab_size: int) -> Array:
    """Float32 logits over the target's vocabulary from logits over a reduced draft
    vocabulary (`draft_vocab` [V'] target ids, the columns of `logits[..., V']`): every
    other id gets -inf, draft probability 0, so q stays exactly the distribution drawn
    from."""
    full = jnp.full(logits_BV.shape[:-1] + (vocab_size,), -jnp.inf, jnp.float32)
    return full.at[..., draft_vocab].set(logits_BV.astype(jnp.float32))


def token_confidence(logits_BV: Array, token_B: Array) -> Array:
    """float32 [B, 2]: the draft's own probability (temperature 1) of each chosen token,
    and its top probability at that position (`confident_drafts` reads both)."""
    log_probs_BV = jax.nn.log_softmax(logits_BV.astype(jnp.float32), axis=-1)
    chosen_B = jnp.exp(jnp.take_along_axis(log_probs_BV, token_B[:, None], axis=1)[:, 0])
    return jnp.stack([chosen_B, jnp.exp(jnp.max(log_probs_BV, axis=-1))], axis=-1)


def confident_drafts(confidence_BK2: Array, min_confidence: float) -> Array:
    """int32 [B]: how many leading drafts to offer (`num_real`): draft j is offered while
    the product of the draft's probabilities of the drafts before it and its top
    probability at j (its estimate that the prefix through j is accepted) is at least
    `min_confidence`. Draft j's own probability never decides whether j is offered: an
    offer that depended on the drafted token's value would select among q's draws, and
    the offered drafts would no longer follow q (not exact)."""
    chosen_BK, top_BK = (confidence_BK2[..., i].astype(jnp.float32) for i in (0, 1))
    before_BK = jnp.cumprod(jnp.concatenate([jnp.ones_like(chosen_BK[:, :1]),
                                             chosen_BK[:, :-1]], axis=1), axis=1)
    offered_BK = (before_BK * top_BK >= min_confidence).astype(jnp.int32)
    return jnp.sum(jnp.cumprod(offered_BK, axis=1), axis=1).astype(jnp.int32)


def draft_chain(step, carry, keys_K: Array, budget: Array | None = None,
                keep_going=None):
    """`lax.scan(step, carry, keys_K)` -> `(carry, outputs [K, ...])`, or a loop that may
    stop early: with a traced `budget` (the most drafts any row will offer,
    `AdaptiveLength`) it runs only the first `budget` steps, and with `keep_going(carry) ->
    bool` (an early exit: no row will offer another draft) it stops once that is False
    after a step (the first step always runs). The outputs of the steps not run are
    zeros: never verified, since no row offers them."""
    if budget is None and keep_going is None:
        return jax.lax.scan(step, carry, keys_K)
    shapes = jax.eval_shape(step, carry, keys_K[0])[1]
    outputs = jax.tree.map(lambda s: jnp.zeros(keys_K.shape[:1] + s.shape, s.dtype), shapes)
    limit = keys_K.shape[0] if budget is None else jnp.minimum(budget, keys_K.shape[0])

    def body(state):
        index, carry, outputs = state
        carry, out = step(carry, keys_K[index])
        return index + 1, carry, jax.tree.map(lambda all_, one: all_.at[index].set(one),
                                              outputs, out)

    def cond(state):
        index, carry, _ = state
        going = index < limit
        if keep_going is not None:
            going = going & ((index == 0) | keep_going(carry))
        return going

    _, carry, outputs = jax.lax.while_loop(cond, body, (jnp.int32(0), carry, outputs))
    return carry, outputs


# What a user may pass as min_confidence; anything else in the field is a stand-in JAX
# puts in a leaf's place while it rebuilds a drafter (a tracer, a lowering's argument info).
_USER_VALUES = (bool, int, float, str, bytes, list, tuple, dict, set, np.ndarray, np.generic,
                jax.Array)


def check_min_confidence(value) -> None:
    if value is None or isinstance(value, jax.core.Tracer) or not isinstance(value,
                                                                           _USER_VALUES):
        return  # checked when the drafter was built
    if isinstance(value, (np.ndarray, np.generic, jax.Array)) and np.ndim(value) == 0 \
            and np.issubdtype(np.asarray(value).dtype, np.floating):
        value = float(value)  # the threshold as a drafter holds it (a float32 leaf)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
        raise ValueError(f"min_confidence must be None (verify every draft) or a number in "
                         f"(0, 1], got {value!r}")


def confidence_leaf(value):
    """`min_confidence` as a drafter keeps it: None, or a float32 scalar leaf, so every
    threshold shares one compiled step (only None or not is part of the program). A numpy
    scalar, not a 0-d array: it hashes and compares like the float it was, so drafters
    stay usable as dict keys and in `==`."""
    check_min_confidence(value)
    if value is None or not isinstance(value, _USER_VALUES) or isinstance(value, jax.Array):
        return value  # a stand-in, or already an array (a drafter rebuilt by jax)
    return np.float32(value)


class Drafter(Protocol):
    def check(self, target: CausalLM, sampling: SamplingConfig) -> None:
        """Refuse (on the host, before tracing) a target this drafter cannot serve."""

    def forwards_per_step(self, num_draft_tokens: int) -> int:
        """Draft model forwards per `propose` (0 for model-free drafters)."""

    def init(self, prompt_tokens_BP: Array, prompt_lengths_B: Array, capacity: int) -> Any: ...

    def propose(self, state: Any, context: DraftContext, key: Array, *, num_draft_tokens: int,
                sampling: SamplingParams, vocab_size: int) -> tuple[Any, Proposal]: ...

    def commit(self, state: Any, commit: Commit) -> Any: ...


def drafter_key(drafter) -> tuple[type, ...]:
    """The drafter's class and those of the drafters it wraps (`.drafter`, e.g.
    `AdaptiveLength`), for the compile key: JAX's tree structures of a registered dataclass
    and of a subclass with the same fields compare equal, so the classes must be there."""
    inner = getattr(drafter, "drafter", None)
    return (type(drafter),) + (drafter_key(inner) if inner is not None else ())


def check_own_tree(drafter, tree) -> None:
    """Refuse (at trace time) a step configured with another tree than the one a drafter
    that builds its own (`proposal_tree`) proposes."""
    if tree != drafter.proposal_tree:
        raise ValueError(f"{type(drafter).__name__} proposes its own tree, "
                         f"{drafter.proposal_tree}; the step was configured with {tree} "
                         "(pass tree=None: decoding takes the drafter's)")


def check_proposal(drafter, proposal, batch: int, num_draft_tokens: int, vocab_size: int,
                   tree: TreeShape | DynamicTree | TreeBudget | None = None) -> None:
    """Refuse (at trace time) a proposal that breaks the drafter contract, naming the
    drafter, the field and the expected shape."""
    name = type(drafter).__name__
    if not isinstance(proposal, Proposal):
        raise TypeError(f"{name}.propose must return (state, specjax.drafters.Proposal), got "
                        f"{type(proposal).__name__}")
    expected = {"tokens": (batch, num_draft_tokens), "q": (batch, num_draft_tokens, vocab_size),
                "never_accept": (batch, num_draft_tokens), "parents": (batch, num_draft_tokens)}
    meaning = {"tokens": "int [batch, num_draft_tokens]",
               "q": "float [batch, num_draft_tokens, target vocab_size]: the distribution "
                    "each draft was drawn from, over the TARGET's vocabulary (give ids the "
                    "draft lacks probability 0)",
               "never_accept": "bool [batch, num_draft_tokens]",
               "parents": "int [batch, num_draft_tokens]: each node's parent, -1 for the "
                          "root, an earlier node otherwise"}
    if proposal.q is None and tree is None:
        raise ValueError(f"{name}.propose returned Proposal.q = None (deterministic drafts), "
                         "which only a tree step verifies without q; for a chain return the "
                         "one-hot q of each draft")
    if proposal.num_real is not None and tuple(proposal.num_real.shape) != (batch,):
        raise ValueError(f"{name}.propose returned Proposal.num_real with shape "
                         f"{tuple(proposal.num_real.shape)}; expected ({batch},) (int: real "
                         "drafts per row)")
    if proposal.never_accept is not None and tree is None:
        raise ValueError(f"{name}.propose marked nodes never_accept, which needs a tree step "
                         "(SpeculativeConfig(tree=...)); a chain accepts a prefix")
    dynamic = getattr(tree, "per_row", False)
    if dynamic and proposal.parents is None:
        raise ValueError(f"{name}.propose returned Proposal.parents = None for a "
                         f"{type(tree).__name__} step: its tree differs per row, so the "
                         "proposal must say each node's parent")
    if not dynamic and proposal.parents is not None:
        raise ValueError(f"{name}.propose returned Proposal.parents, but the step's tree is "
                         f"{'a chain' if tree is None else 'a static TreeShape'}, whose "
                         "shape the config fixes; return parents only for a DynamicTree "
                         "or TreeBudget step")
    for field, shape in expected.items():
        value = getattr(proposal, field)
        if value is not None and tuple(value.shape) != shape:
            raise ValueError(f"{name}.propose returned Proposal.{field} with shape "
                             f"{tuple(value.shape)}; expected {shape} ({meaning[field]})")
    if not jnp.issubdtype(proposal.tokens.dtype, jnp.integer):
        raise TypeError(f"{name}.propose returned Proposal.tokens of dtype "
                        f"{proposal.tokens.dtype}; token ids must be integers")
    if proposal.parents is not None and not jnp.issubdtype(proposal.parents.dtype,
                                                            jnp.integer):
        raise TypeError(f"{name}.propose returned Proposal.parents of dtype "
                        f"{proposal.parents.dtype}; parent indices must be integers")
    if proposal.q is not None and not jnp.issubdtype(proposal.q.dtype, jnp.floating):
        raise TypeError(f"{name}.propose returned Proposal.q of dtype {proposal.q.dtype}; "
                        "q must be floating-point probabilities")


def check_trained_positions(value) -> None:
    """A parallel drafter's `trained_positions`: None (unknown) or a positive int."""
    if value is not None and (isinstance(value, bool)
                              or not isinstance(value, (int, np.integer)) or value < 1):
        raise ValueError(f"trained_positions must be the K the drafter was trained for (an "
                         f"int >= 1) or None (unknown), got {value!r}")


def warn_beyond_training(drafter, num_draft_tokens: int, positions: int) -> None:
    """Decoding is exact whatever K, but a drafter asked for more than it learned drafts
    guesses: say so (once per message) when K exceeds the drafts a parallel drafter was
    trained to make at once (`trained_positions`), or when the positions a draft model
    reads (`positions`: the longest prompt + new tokens) or K exceed its `max_seq_len`."""
    import warnings

    name = type(drafter).__name__
    trained = getattr(drafter, "trained_positions", None)
    if trained is not None and num_draft_tokens > trained:
        warnings.warn(f"{name} was trained to draft {trained} tokens at once; K="
                      f"{num_draft_tokens} drafts the last {num_draft_tokens - trained} from "
                      f"placeholders it never learned (exact, but they are rarely accepted: "
                      f"K <= {trained} is faster)", stacklevel=3)
    limit = getattr(getattr(drafter, "lm", None), "max_seq_len", None)
    if limit is not None and max(positions, num_draft_tokens) > limit:
        warnings.warn(f"{name}'s draft model has max_seq_len={limit}, and this request reads "
                      f"{positions} positions (the longest prompt and the new tokens) with "
                      f"K={num_draft_tokens}: exact, but its drafts past {limit} are "
                      "extrapolation (a shorter request, a smaller K or a draft trained on "
                      "longer sequences is faster)", stacklevel=3)
