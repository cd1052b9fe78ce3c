"""How retrieval's tau grows with its datastore: SmolLM2's bundled datastore cut to random
fractions of its documents (its own greedy answers), the held-out prompts of each kind
(`benchmarks/real_prompts.py`) decoded greedily with `Retrieval` (datastore + own text,
the defaults), tau and drafts verified per step for each size. Greedy tokens and each
row's drafts do not depend on the batch, so a kind's prompts decode as one batch; no
speed is measured here (`benchmarks/drafters/model_free.py` does), only what a larger store buys.

A fit tau = a + b log2(tokens) on chat extrapolates the datastore at which chat's tau
reaches the tau that 1.25x plain decoding needs at the measured verify cost of its width
(issue 26's chat goal): `--needed-tau`, from `model_free_cpu.md` (1.25 x v at ~2 nodes).

    python -m benchmarks.drafters.retrieval_scaling [--fractions 0 0.125 0.25 0.5 1] \
        [--new-tokens 48]
"""

from __future__ import annotations

import argparse
import json

import numpy as np

import specjax
import specjax_models
from benchmarks.common import RESULTS, machine_record, smollm2, write_results
from benchmarks.real_prompts import PROMPTS
from specjax.drafters import Retrieval
from specjax.drafters.datastore import Datastore

NAME = "retrieval_scaling_cpu"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fractions", type=float, nargs="+",
                        default=[0.0, 0.125, 0.25, 0.5, 1.0])
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--needed-tau", type=float, default=1.65)
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite the report of an earlier run from its JSON")
    args = parser.parse_args()
    if args.report_only:
        write_report(json.loads((RESULTS / f"{NAME}.json").read_text()))
        return
    target, tok = smollm2()
    full = Datastore.load(specjax_models.SMOLLM2_DATASTORE)
    docs = full.documents()
    order = np.random.default_rng(0).permutation(len(docs))
    requests = {kind: [tok.apply_chat_template([{"role": "user", "content": p}])
                       for p in prompts] for kind, prompts in PROMPTS.items()}
    rows = []
    for fraction in args.fractions:
        count = round(fraction * len(docs))
        store = (Datastore.build([docs[i] for i in sorted(order[:count])], full.vocab_size)
                 if count else None)
        drafter = Retrieval(store)
        for kind, ids in requests.items():
            out = specjax.speculative_generate(target, drafter, ids,
                                               max_new_tokens=args.new_tokens,
                                               sampling=specjax.GREEDY, eos_id=tok.eos_ids)
            stats = out.stats
            forwards = int(np.sum(stats.target_forwards))
            row = {"fraction": fraction, "documents": count,
                   "tokens": store.num_tokens if store is not None else 0, "kind": kind,
                   "tau": int(np.sum(stats.emitted)) / forwards,
                   "nodes_per_step": int(np.sum(stats.proposed)) / forwards}
            rows.append(row)
            print(json.dumps(row), flush=True)
    chat = [r for r in rows if r["kind"] == "chat" and r["tokens"] > 0]
    fit = None
    if len(chat) >= 2:
        slope, intercept = np.polyfit(np.log2([r["tokens"] for r in chat]),
                                      [r["tau"] for r in chat], 1)
        needed = (2.0 ** ((args.needed_tau - intercept) / slope) if slope > 0 else None)
        fit = {"intercept": float(intercept), "slope_per_doubling": float(slope),
               "tokens_for_needed_tau": needed}
    result = {"benchmark": "retrieval_scaling", "machine": machine_record(),
              "args": vars(args), "full_documents": len(docs), "rows": rows, "chat_fit": fit}
    write_report(result)


def write_report(result: dict) -> None:
    args = argparse.Namespace(**result["args"])
    machine = result["machine"]
    fractions = " ".join(f"{f:g}" for f in args.fractions)
    lines = [
        "# Retrieval on SmolLM2-135M-Instruct: tau against the datastore's size", "",
        f"`python -m benchmarks.drafters.retrieval_scaling --fractions {fractions} --new-tokens "
        f"{args.new_tokens}` on {machine.get('cpu_model') or 'this CPU'} "
        f"({machine.get('cpu_count')} cores). The bundled datastore "
        f"({result['full_documents']} documents: SmolLM2's greedy answers to training "
        "prompts) cut to random fractions of its documents; `Retrieval(store)` (datastore "
        "+ own text; fraction 0: own text only) on the 8 held-out prompts of each kind "
        f"through the chat template, greedy, at most {args.new_tokens} new tokens. tau: "
        "tokens per target forward; nodes: drafts verified per step.", "",
        "| fraction | documents | tokens | kind | tau | nodes |", "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['fraction']:g} | {r['documents']} | {r['tokens']} | {r['kind']} "
                     f"| {r['tau']:.3f} | {r['nodes_per_step']:.2f} |")
    fit = result["chat_fit"]
    if fit:
        needed = fit["tokens_for_needed_tau"]
        lines += ["", f"Chat: tau = {fit['intercept']:.3f} + {fit['slope_per_doubling']:.3f} "
                  "x log2(tokens). The chat goal (1.25x plain decoding) needs tau ~ "
                  f"{args.needed_tau} at the verify cost of ~2-3 nodes on this CPU "
                  "(model_free_cpu.md: v = 1.32); on this fit that is a datastore of "
                  + (f"~{needed:.2g} tokens ({needed / result['rows'][-1]['tokens']:.2g}x "
                     "the bundled one)" if needed else "no size: tau does not grow with the "
                     "store") + (": beyond any store of the model's own answers; on chat the "
                     "store's size is not the lever (each doubling adds "
                     f"{fit['slope_per_doubling']:.3f} to tau)." if not needed or needed > 1e3
                     * result["rows"][-1]["tokens"] else ", if the trend held that far.")]
    write_results(NAME, result, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
