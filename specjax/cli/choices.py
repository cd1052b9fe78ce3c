"""The drafter a decoding command's options name (`--drafter`, `--draft`, `--drafter-dir`)
and the groups of choices the checks and loaders share."""

from __future__ import annotations

HEAD_CHOICES = ("medusa", "eagle", "eagle3", "mtp", "kangaroo", "p-eagle")
P_EAGLE = "p-eagle"  # a parallel EAGLE head: K drafts from one head forward
MODEL_FREE_CHOICES = ("lookahead", "retrieval")
SELF_CHOICES = ("layer-skip",)
PARALLEL = "parallel"  # a parallel draft (PARD): --draft DIR, or the bundled pair's
PUBLISHED = "published"  # --drafter-dir: a downloaded EAGLE / Medusa head


def drafter_choice(args) -> str:
    """The bundled pair drafts with its draft model; SmolLM2 with prompt lookup (its shipped
    EAGLE-3 head, `--drafter eagle3`, and distilled draft, `--drafter model`, are still too
    weak to beat it: see their MODEL_CARDs), unless --draft names a draft that shares its
    tokenizer."""
    if getattr(args, "drafter_dir", None):
        return PUBLISHED
    if args.drafter is not None:
        return args.drafter
    bundled = args.model == "bundled" and not getattr(args, "hf", None)
    return "model" if bundled or args.draft else "prompt-lookup"
