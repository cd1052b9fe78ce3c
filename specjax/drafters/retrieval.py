"""Retrieval drafting: REST (He et al. 2023) and SuffixDecoding (Oliaro et al. 2024).

No draft model. Each step, for every row:

1. find the longest suffix of the row (at most `max_query` tokens) that occurs in each
   source: the datastore (a corpus, and the earlier answers that `remember` adds between
   calls: SuffixDecoding's global store), searched by binary search over its suffix
   array (`specjax.datastore`), and the row's own prompt and output (SuffixDecoding's
   per-request store), searched directly;
2. read what followed up to `samples` of its occurrences in the sources whose match is
   the longest (`depth` tokens each);
3. merge them into a trie (`specjax.trees.tries`) and keep its most frequent nodes: a node
   whose estimated probability (occurrences through it / occurrences read) is under
   `min_probability` is dropped, at most `max_branching` children per node, and at most
   `max_nodes` nodes, or `speculation_factor` x the match length when set (the longer the
   match, the more it is trusted: SuffixDecoding's adaptive speculation length).

The tree is deterministic (q = None): a sampled step accepts x with probability p(x), so
the output is exact at every temperature. A row offers its real nodes
(`Proposal.num_real`), the first of the budget; each step verifies the smallest of 0, 1,
2, 4, ... `max_nodes` nodes that covers every running row's (`graded_num_real`), so it
pays for the tree it has, and with no match anywhere it is a one-token forward, plain
decoding's cost.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import jax
import jax.numpy as jnp
from jax import Array

from specjax.decoding.sampling import SamplingConfig, SamplingParams
from specjax.drafters.base import Commit, DraftContext, Proposal, check_own_tree
from specjax.drafters.datastore import Datastore, continuations, longest_match
from specjax.drafters.prompt_lookup import suffix_match_lengths
from specjax.lm.causal_lm import CausalLM
from specjax.trees.shapes import TreeBudget
from specjax.trees.tries import merge_into_trie


def _positive_int(name: str, value, least: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"Retrieval({name}=...) must be an int >= {least}, got {value!r}")


def own_text_matches(sequence_BS: Array, lengths_B: Array, max_query: int, min_match: int,
                     num_samples: int, depth: int):
    """The row as its own datastore: `(sequences int32 [B, C, D], lengths int32 [B, C],
    match int32 [B])`, the D tokens after the C most recent earlier occurrences of the
    row's longest suffix (at most `max_query`, at least `min_match` tokens) in its own
    committed tokens, each cut at the row's end."""
    batch, slots = sequence_BS.shape
    end_S = jnp.arange(slots, dtype=jnp.int32)
    length_BS = suffix_match_lengths(sequence_BS, lengths_B, max_query)
    match_B = jnp.max(length_BS, axis=1)
    match_B = jnp.where(match_B >= min_match, match_B, 0).astype(jnp.int32)
    recent_BS = jnp.where((length_BS == match_B[:, None]) & (match_B[:, None] > 0),
                          end_S[None, :], -1)
    if num_samples > slots:  # a short request has fewer earlier occurrences than samples
        recent_BS = jnp.pad(recent_BS, ((0, 0), (0, num_samples - slots)), constant_values=-1)
    end_BC, _ = jax.lax.top_k(recent_BS, num_samples)  # the most recent first
    index_BCD = end_BC[:, :, None] + 1 + jnp.arange(depth, dtype=jnp.int32)[None, None, :]
    tokens_BCD = jnp.take_along_axis(
        sequence_BS, jnp.clip(index_BCD, 0, slots - 1).reshape(batch, -1), axis=1
    ).reshape(index_BCD.shape)
    inside_BCD = index_BCD < lengths_B[:, None, None]
    lengths_BC = jnp.where(end_BC >= 0, jnp.sum(inside_BCD, axis=2), 0)
    return tokens_BCD.astype(jnp.int32), lengths_BC.astype(jnp.int32), match_B


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Retrieval:
    """Draft a token tree from what followed the row's longest matching suffix.

    datastore: a `specjax.datastore.Datastore` (its arrays are the drafter's leaves: a new
      datastore of the same size reuses the compiled decoder), or None to search each
      row's own text only. search_own_text: also search the row's prompt and output.
    max_nodes: N, the tree's node budget (every step verifies N nodes, or one token when
      no running row has a match). depth: the longest drafted path. samples: occurrences
      read per source. max_query, min_match: the suffix lengths searched.
    min_probability: drop nodes that fewer than this share of the occurrences pass through.
    max_branching: children kept per node. speculation_factor: when set, a row with a
      match of m tokens gets at most ceil(factor * m) nodes. own_text_bonus: the row's own
      text wins over the datastore when its match is at most this much shorter (0: the
      longer match wins, ties merge both).

    The defaults favour cheap steps, as a CPU needs: on SmolLM2 with its shipped datastore
    (held-out prompts, greedy), an offline grid over max_nodes 4-16, min_probability
    0.1-0.65 and min_match 1-3 put the most tokens per unit of verify cost at
    min_match 2 and min_probability 0.5-0.65 (a wide tree, at 0.1, accepted more per
    step but cost more than it gained); an accelerator, where a wide verify is nearly
    free, gains from min_probability 0.1 and more nodes.
    """

    datastore: Datastore | None = None
    max_nodes: int = dataclasses.field(default=16, metadata={"static": True})
    depth: int = dataclasses.field(default=6, metadata={"static": True})
    samples: int = dataclasses.field(default=16, metadata={"static": True})
    max_query: int = dataclasses.field(default=8, metadata={"static": True})
    min_match: int = dataclasses.field(default=2, metadata={"static": True})
    min_probability: float = dataclasses.field(default=0.5, metadata={"static": True})
    max_branching: int = dataclasses.field(default=4, metadata={"static": True})
    speculation_factor: float | None = dataclasses.field(default=None,
                                                         metadata={"static": True})
    search_own_text: bool = dataclasses.field(default=True, metadata={"static": True})
    own_text_bonus: int = dataclasses.field(default=0, metadata={"static": True})

    drafts_trees = True
    # Real nodes come first (`specjax.trees.tries`): a step verifies only as many nodes as the
    # running rows offer (0, 1, 2, 4, ... max_nodes), not the whole budget.
    graded_num_real = True

    def __post_init__(self):
        for name in ("max_nodes", "depth", "samples", "max_query", "min_match",
                     "max_branching"):
            _positive_int(name, getattr(self, name))
        _positive_int("own_text_bonus", self.own_text_bonus, least=0)
        if self.min_match > self.max_query:
            raise ValueError(f"Retrieval(min_match={self.min_match}) exceeds max_query="
                             f"{self.max_query}")
        if self.depth > self.max_nodes:
            raise ValueError(f"Retrieval(depth={self.depth}) exceeds max_nodes="
                             f"{self.max_nodes}: a path of d tokens needs d nodes")
        probability = self.min_probability
        if (isinstance(probability, bool) or not isinstance(probability, (int, float))
                or not 0.0 <= probability <= 1.0):
            raise ValueError(f"Retrieval(min_probability=...) must be in [0, 1], got "
                             f"{probability!r}")
        factor = self.speculation_factor
        if factor is not None and (isinstance(factor, bool)
                                   or not isinstance(factor, (int, float)) or factor <= 0):
            raise ValueError(f"Retrieval(speculation_factor=...) must be None or a number "
                             f"> 0, got {factor!r}")
        if self.datastore is not None and not isinstance(self.datastore, Datastore):
            raise TypeError(f"Retrieval(datastore=...) must be a specjax.datastore.Datastore "
                            f"or None, got {type(self.datastore).__name__}")
        if self.datastore is None and not self.search_own_text:
            raise ValueError("Retrieval has nothing to search: give a datastore, or keep "
                             "search_own_text=True")

    @property
    def proposal_tree(self) -> TreeBudget:
        return TreeBudget(num_nodes=self.max_nodes, max_depth=self.depth,
                          max_branching=self.max_branching)

    def check(self, target: CausalLM, sampling: SamplingConfig) -> None:
        """The datastore must hold ids of the target's vocabulary."""
        if self.datastore is not None and self.datastore.vocab_size != target.vocab_size:
            raise ValueError(f"the datastore holds ids of a {self.datastore.vocab_size}-token "
                             f"vocabulary but the target's has {target.vocab_size}: build "
                             "it with the target's tokenizer")

    def forwards_per_step(self, num_draft_tokens: int, **_) -> int:
        return 0

    def remember(self, documents: Iterable[Sequence[int]], vocab_size: int | None = None
                 ) -> Retrieval:
        """This drafter with `documents` (e.g. the answers of the last call) added to its
        datastore, SuffixDecoding's store of earlier outputs that grows between calls.
        Without a datastore, `vocab_size` (the target's) starts one."""
        if self.datastore is None:
            if vocab_size is None:
                raise ValueError("this Retrieval has no datastore yet: pass vocab_size (the "
                                 "target's) to start one")
            return dataclasses.replace(self, datastore=Datastore.build(documents, vocab_size))
        return dataclasses.replace(self, datastore=self.datastore.add(documents))

    def init(self, prompt_tokens_BP: Array, prompt_lengths_B: Array, capacity: int) -> Array:
        return jnp.zeros((prompt_tokens_BP.shape[0],), jnp.int32)  # no state to keep

    def commit(self, state: Array, commit: Commit) -> Array:
        return state

    def candidates(self, context: DraftContext, vocab_size: int):
        """`(sequences [B, C, D], lengths [B, C], match [B])`: the continuations of the
        sources whose match is the longest (the row's own text's counting
        `own_text_bonus` tokens longer; length 0 elsewhere), and that match."""
        sources = []
        if self.datastore is not None:
            start_B, count_B, match_B = longest_match(
                self.datastore, context.sequence, context.lengths, self.max_query,
                self.min_match)
            sources.append((*continuations(self.datastore, start_B, count_B, match_B,
                                           self.samples, self.depth, vocab_size), match_B, 0))
        if self.search_own_text:
            tokens, lengths, match_B = own_text_matches(
                context.sequence, context.lengths, self.max_query, self.min_match,
                self.samples, self.depth)
            sources.append((tokens, lengths, match_B, self.own_text_bonus))
        # A source's standing: its match, plus the bonus of the row's own text.
        standing = [jnp.where(match > 0, match + bonus, 0) for *_, match, bonus in sources]
        best_B = jnp.max(jnp.stack(standing), axis=0)
        chosen = [(rank == best_B) & (best_B > 0) for rank in standing]
        sequences = jnp.concatenate([tokens for tokens, *_ in sources], axis=1)
        lengths = jnp.concatenate([jnp.where(use[:, None], length, 0)
                                   for (_, length, *_), use in zip(sources, chosen,
                                                                   strict=True)], axis=1)
        match_B = jnp.max(jnp.stack([jnp.where(use, match, 0) for (*_, match, _), use
                                     in zip(sources, chosen, strict=True)]), axis=0)
        return sequences, lengths, match_B

    def propose(self, state: Array, context: DraftContext, key: Array, *,
                num_draft_tokens: int, sampling: SamplingParams, vocab_size: int,
                tree: TreeBudget | None = None) -> tuple[Array, Proposal]:
        check_own_tree(self, tree)
        sequences_BCD, lengths_BC, match_B = self.candidates(context, vocab_size)
        read_B = jnp.sum(lengths_BC > 0, axis=1)
        min_count_B = jnp.maximum(1, jnp.ceil(self.min_probability * read_B - 1e-6)
                                  ).astype(jnp.int32)
        max_nodes_B = None
        if self.speculation_factor is not None:
            max_nodes_B = jnp.ceil(self.speculation_factor * match_B - 1e-6).astype(jnp.int32)
        trie = merge_into_trie(sequences_BCD, lengths_BC, self.max_nodes,
                               min_count_B=min_count_B, max_nodes_B=max_nodes_B,
                               max_branching=self.max_branching)
        return state, Proposal(tokens=jnp.minimum(trie.tokens, vocab_size - 1), q=None,
                               never_accept=~trie.real, parents=trie.parents,
                               num_real=trie.num_real)

