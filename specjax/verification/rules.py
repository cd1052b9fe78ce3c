"""The verification rule of a step: which drafts it keeps, and what it emits after them.

One name for every decoder (`speculative_generate`, `speculative_stream`,
`SpeculativeConfig` for `speculative_step` / `jitted_step`, the command line's
`--verification`):

- "block": block verification (Sun et al., ICLR 2025;
  specjax.verification.block_verification). Judges a chain jointly; exact, and never
  accepts fewer tokens than "token" in expectation.
  Chains only: a tree is refused by name (its tree form is "traversal").
- "traversal": traversal verification (Weng et al., NeurIPS 2025;
  specjax.verification.traversal_verification). Judges a tree leaf to root with block verification's
  running weight; exact. On a chain it IS block verification (the step runs
  `accept_block`, and the stats name "traversal").
- "token": token-level rejection sampling, the first rejection ends the step (Leviathan
  et al. / Chen et al. for chains, specjax.verification.rejection; recursive rejection
  sampling for trees, specjax.verification.tree_acceptance). Exact. The rule of specjax
  before block verification: pass it to reproduce an older seeded run.
- `TypicalAcceptance(epsilon, delta)`, or the name "typical" for Medusa's published
  setting (epsilon 0.09, delta 0.3): Medusa-2's typical acceptance
  (specjax.verification.typical_acceptance). NOT EXACT: a labelled lossy mode, never a default.

The default (None) is the exact rule that accepts the most for the proposal shape:
"block" for a chain, "traversal" for a tree. At temperature 0 every rule accepts exactly
the drafts equal to the target's argmax and emits the argmax: an all-greedy batch takes
the argmax rules whichever rule is named. The rule is part of the compiled step (static);
the sampling values stay data.

Stats name the rule that RAN (`rule_that_ran`): "greedy" for an all-greedy batch (the
argmax rules, whichever rule was asked for), "block" for a chain asked to run "traversal",
and the typical rule with its settings ("typical (not exact; epsilon=0.09, delta=0.3)").
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array

from specjax.verification.block_verification import accept_block
from specjax.verification.rejection import Acceptance, accept_sampled
from specjax.verification.traversal_verification import accept_traversal
from specjax.verification.tree_acceptance import TreeAcceptance, accept_tree_sampled
from specjax.verification.typical_acceptance import (
    TypicalAcceptance,
    accept_typical_chain,
    accept_typical_tree,
)

EXACT_RULES = ("block", "traversal", "token")
RULE_NAMES = (*EXACT_RULES, "typical")  # what the library and the command line accept
GREEDY_RULE = "greedy"  # what an all-greedy batch runs: the argmax matches, under any rule

Verification = str | TypicalAcceptance


def resolve_verification(verification: Verification | None, tree) -> Verification:
    """The rule a step runs: `verification` checked against the proposal shape (`tree`
    None for a chain), None replaced by the shape's default."""
    if verification is None:
        return "block" if tree is None else "traversal"
    if isinstance(verification, TypicalAcceptance):
        return verification
    if verification == "typical":
        return TypicalAcceptance()
    if not isinstance(verification, str) or verification not in EXACT_RULES:
        raise ValueError(f"verification must be one of {', '.join(map(repr, RULE_NAMES))}, "
                         "None (the default: 'block' for a chain, 'traversal' for a tree) or "
                         "specjax.TypicalAcceptance(epsilon, delta) ('typical' is Medusa's "
                         f"setting, epsilon 0.09 and delta 0.3; NOT exact); got "
                         f"{verification!r}")
    if verification == "block" and tree is not None:
        raise ValueError("verification='block' judges a chain of drafts; this step verifies "
                         "a tree: pass verification='traversal' (block verification's tree "
                         "form) or 'token' (recursive rejection sampling), or None (the best "
                         "exact rule for the shape)")
    return verification


def verification_name(rule: Verification) -> str:
    """How stats and the command line name a rule: its name, the lossy one with its
    settings ("typical (not exact; epsilon=0.09, delta=0.3)")."""
    return rule.label if isinstance(rule, TypicalAcceptance) else rule


def rule_that_ran(rule: Verification, tree, all_greedy: bool) -> str:
    """The name of the rule a step actually runs for the resolved `rule`, the proposal
    shape (`tree` None: a chain) and whether every row is greedy: "greedy" (the argmax
    rules), "block" for a chain's "traversal", else `verification_name(rule)`."""
    if all_greedy:
        return GREEDY_RULE
    if rule == "traversal" and tree is None:
        return "block"
    return verification_name(rule)


def is_lossy_rule_name(name: str | None) -> bool:
    """Whether a rule named in stats (`rule_that_ran`) is the lossy one."""
    return isinstance(name, str) and name.startswith(TypicalAcceptance.name.split(" ")[0])


def offered_drafts(proposal, width: int) -> Array | None:
    """int32 [B]: the drafts of a chain each row offers (`proposal.num_real`, at most
    `width`), or None when every row offers all."""
    if proposal.num_real is None:
        return None
    return jnp.clip(proposal.num_real, 0, width).astype(jnp.int32)


def verify_chain(rule: Verification, keys: tuple[Array, Array], tokens_BK: Array,
                 q_BKV: Array, p_BK1V: Array, limit_B: Array | None) -> Acceptance:
    """A chain under `rule`, for a batch with sampled rows (warped p; greedy rows one-hot)."""
    if isinstance(rule, TypicalAcceptance):
        return accept_typical_chain(keys[1], tokens_BK, p_BK1V, rule, limit_B)
    if rule in ("block", "traversal"):  # a chain's traversal is block verification
        return accept_block(*keys, tokens_BK, q_BKV, p_BK1V, limit_B)
    return accept_sampled(*keys, tokens_BK, q_BKV, p_BK1V, limit_B)


def verify_tree(rule: Verification, keys: tuple[Array, Array], tokens_BN: Array,
                parents_BN: Array, p_BN1V: Array, q_BNV: Array | None, *, max_depth: int,
                max_branching: int, never_accept_BN: Array | None) -> TreeAcceptance:
    """A tree under `rule` ("traversal", "token" or typical; see `resolve_verification`)."""
    if isinstance(rule, TypicalAcceptance):
        return accept_typical_tree(keys[1], tokens_BN, parents_BN, p_BN1V, rule,
                                   max_depth=max_depth, never_accept_BN=never_accept_BN)
    if rule == "traversal":
        return accept_traversal(*keys, tokens_BN, parents_BN, p_BN1V, q_BNV,
                                max_depth=max_depth, max_branching=max_branching,
                                never_accept_BN=never_accept_BN)
    return accept_tree_sampled(*keys, tokens_BN, parents_BN, p_BN1V, q_BNV,
                               max_depth=max_depth, max_branching=max_branching,
                               never_accept_BN=never_accept_BN)
