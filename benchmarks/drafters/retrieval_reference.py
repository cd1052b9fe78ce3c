"""Our retrieval against REST's own (`draftretriever`, the REST authors' Rust datastore,
from PyPI) on the same datastore: SmolLM2's shipped answers
(`models/checkpoints/smollm2_datastore.npz`), written into a draftretriever index too.

Queries: every position of SmolLM2's greedy answers to the held-out prompts
(`benchmarks/real_prompts.py`, none in the datastore). REST searches the last 16, 15,
... 2 tokens until one occurs (its `token_spans`) and returns the `choices` most frequent
nodes of the trie of what followed, in the datastore and, as draftretriever's `search`
does, in the query itself (the last 16 tokens); ours (`Retrieval` with the same budget
and depth, no frequency threshold, searching the datastore and the row's whole text)
finds the longest suffix by binary search and merges `--samples` occurrences of each
source whose match is the longest. Per query: the match length each found, the overlap of the two
trees (Jaccard of their node sets, as token paths), and the accepted length each tree
gives against the answer's true continuation (greedy: the longest path that equals it),
whose mean plus one is the tau each would reach with a free verify.

    python -m benchmarks.drafters.retrieval_reference [--nodes 16] [--depth 6] [--samples 64]

arctic-inference (Snowflake's SuffixDecoding) is not compared: it ships as a source
distribution whose build needs vLLM and CUDA, which do not install here.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import specjax
import specjax_models
from benchmarks.common import machine_record, smollm2, write_results
from benchmarks.real_prompts import PROMPTS
from specjax.drafters import Retrieval
from specjax.drafters.base import DraftContext
from specjax.drafters.datastore import Datastore
from specjax.runtime.timing import wall_seconds
from specjax.trees.shapes import node_paths

MAX_SPAN = 16


def rest_index(store: Datastore, path: Path):
    import draftretriever

    writer = draftretriever.Writer(file_path=str(path), vocab_size=store.vocab_size)
    for document in store.documents():
        if document.size:
            writer.add_entry(document.tolist())
    writer.finalize()
    return draftretriever.Reader(index_file_path=str(path))


def rest_tree(reader, context: list[int], nodes: int, depth: int):
    """REST's tree for one context: (match length, set of node paths)."""
    for span in range(MAX_SPAN, 1, -1):
        if len(context) < span:
            continue
        retrieved = reader.search(context[-span:], choices=nodes)[0]
        if retrieved:
            paths = set()
            for sequence in retrieved:
                tokens = [t for t in sequence if t >= 0][:depth]
                paths.update(tuple(tokens[:end]) for end in range(1, len(tokens) + 1))
            return span, paths
    return 0, set()


def our_trees(drafter: Retrieval, contexts: list[list[int]], vocab_size: int):
    """Our trees for a batch of contexts: (match lengths, list of node-path sets)."""
    width = max(len(c) for c in contexts)
    sequence = np.zeros((len(contexts), width + 1), np.int32)
    for b, context in enumerate(contexts):
        sequence[b, :len(context)] = context
    context = DraftContext(jnp.asarray(sequence), jnp.asarray([len(c) for c in contexts]))

    @jax.jit
    def propose(drafter, context):
        match = drafter.candidates(context, vocab_size)[2]
        _, proposal = drafter.propose(0, context, jax.random.key(0),
                                      num_draft_tokens=drafter.max_nodes, sampling=None,
                                      vocab_size=vocab_size, tree=drafter.proposal_tree)
        return match, proposal

    match, proposal = jax.tree.map(np.asarray, propose(drafter, context))
    return match, [set(node_paths(proposal.tokens[b], proposal.parents[b],
                                  ~proposal.never_accept[b])) for b in range(len(contexts))]


def accepted(paths: set, truth: list[int]) -> int:
    length = 0
    while length < len(truth) and tuple(truth[:length + 1]) in paths:
        length += 1
    return length


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--name", default="retrieval_reference_cpu")
    args = parser.parse_args()
    store = Datastore.load(specjax_models.SMOLLM2_DATASTORE)
    target, tok = smollm2()
    ours = Retrieval(store, max_nodes=args.nodes, depth=args.depth, samples=args.samples,
                     max_query=MAX_SPAN, min_match=2, min_probability=0.0,
                     max_branching=args.nodes, search_own_text=True)
    with tempfile.TemporaryDirectory() as directory:
        (reader, build_s) = wall_seconds(lambda: rest_index(store, Path(directory) / "ds.idx"))
        rows = []
        for kind, prompts in PROMPTS.items():
            ids = [tok.apply_chat_template([{"role": "user", "content": p}]) for p in prompts]
            out = specjax.generate(target, ids, max_new_tokens=args.new_tokens,
                                   sampling=specjax.GREEDY, eos_id=tok.eos_ids)
            contexts, truths = [], []
            for b, prompt in enumerate(ids):
                answer = np.asarray(out.tokens[b, :int(out.lengths[b])]).tolist()
                for t in range(1, len(answer)):
                    contexts.append(prompt + answer[:t])
                    truths.append(answer[t:t + args.depth])
            (match, trees), ours_s = wall_seconds(lambda c=contexts: our_trees(
                ours, c, target.vocab_size))
            rest, rest_s = wall_seconds(lambda c=contexts: [
                rest_tree(reader, one, args.nodes, args.depth) for one in c])
            same_match = np.mean([int(m) == r for m, (r, _) in zip(match, rest, strict=True)])
            jaccard = np.mean([len(a & b) / len(a | b) if a | b else 1.0
                               for a, (_, b) in zip(trees, rest, strict=True)])
            row = {"kind": kind, "queries": len(contexts), "same_match": float(same_match),
                   "jaccard": float(jaccard),
                   "ours_accepted": float(np.mean([accepted(a, t) for a, t
                                                   in zip(trees, truths, strict=True)])),
                   "rest_accepted": float(np.mean([accepted(b, t) for (_, b), t
                                                   in zip(rest, truths, strict=True)])),
                   "ours_nodes": float(np.mean([len(a) for a in trees])),
                   "rest_nodes": float(np.mean([len(b) for _, b in rest])),
                   "ours_ms_per_query": 1e3 * ours_s / len(contexts),
                   "rest_ms_per_query": 1e3 * rest_s / len(contexts)}
            rows.append(row)
            print(row, flush=True)
    machine = machine_record()
    lines = ["# Retrieval: our trees against REST's draftretriever on one datastore", "",
             f"`python -m benchmarks.drafters.retrieval_reference --nodes {args.nodes} --depth "
             f"{args.depth} --samples {args.samples}` on {machine.get('cpu_model')} "
             f"({machine.get('cpu_count')} cores). Datastore: SmolLM2's shipped answers "
             f"({store.num_documents} documents, {store.num_tokens} tokens; draftretriever's "
             f"index built in {build_s:.1f} s). Queries: every position of SmolLM2's greedy "
             f"answers (at most {args.new_tokens} tokens) to the held-out prompts; trees of at "
             f"most {args.nodes} nodes and depth {args.depth}, no frequency threshold; REST "
             f"tries spans {MAX_SPAN}..2 as its `token_spans` do, and its search also "
             "looks in the span itself; ours searches the datastore and the row's whole "
             "text. accepted: mean accepted "
             "length against the true greedy continuation (tau - 1 with a free verify); "
             "ms/query: ours is one jitted batch of every query (compile included), "
             "REST's a Python loop of Rust searches.", "",
             "| kind | queries | same match length | node overlap (Jaccard) | accepted, ours "
             "| accepted, REST | nodes, ours | nodes, REST | ms/query ours | ms/query REST |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['kind']} | {r['queries']} | {r['same_match']:.0%} | {r['jaccard']:.2f} | "
              f"{r['ours_accepted']:.2f} | {r['rest_accepted']:.2f} | {r['ours_nodes']:.1f} | "
              f"{r['rest_nodes']:.1f} | {r['ours_ms_per_query']:.2f} | "
              f"{r['rest_ms_per_query']:.2f} |" for r in rows]
    write_results(args.name, {"benchmark": "retrieval_reference", "machine": machine,
                              "args": vars(args), "rows": rows}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
