#!/usr/bin/env bash
# Train the bundled pair from scratch: target, draft, distilled draft, then measure the
# draft's acceptance before and after distillation. Resumable: rerun the same command
# and every phase continues from its latest checkpoint.
#
#   bash models/recipes/train_bundled.sh WORK_DIR            # full run (the bundled recipe)
#   SCALE=tiny bash models/recipes/train_bundled.sh WORK_DIR # a smoke test of the pipeline
#
# Env: CORPUS (a saved corpus dir; default: this Python's stdlib), MAX_SECONDS_* (stop a
# phase early; rerun to resume), INSTALL_TO (copy the results to models/checkpoints).
set -euo pipefail
work="${1:?usage: train_bundled.sh WORK_DIR}"
mkdir -p "$work"
corpus_args=()
[ -n "${CORPUS:-}" ] && corpus_args=(--corpus "$CORPUS")
if [ "${SCALE:-full}" = tiny ]; then
  t_steps=4 d_steps=4 k_steps=4 batch=4 eval=2 every=2
else
  t_steps=${TARGET_STEPS:-4000} d_steps=${DRAFT_STEPS:-4000} k_steps=${DISTILL_STEPS:-3000}
  batch=${BATCH:-32} eval=8 every=500
fi
# 512-token windows: prompts (<= 342 bytes) plus 160 new tokens stay within the positions
# the models were trained on.
common=(--batch-size "$batch" --seq-len 512 --eval-batches "$eval" --checkpoint-every "$every"
        --eval-every "$every" --log-every 50 "${corpus_args[@]}")
python -m specjax.cli train --config target --out "$work/target" --steps "$t_steps" --learning-rate 3e-3 \
  --warmup-steps 200 ${MAX_SECONDS_TARGET:+--max-seconds $MAX_SECONDS_TARGET} "${common[@]}"
python -m specjax.cli train --config draft --out "$work/draft_pretrained" --steps "$d_steps" \
  --learning-rate 3e-3 --warmup-steps 200 ${MAX_SECONDS_DRAFT:+--max-seconds $MAX_SECONDS_DRAFT} \
  "${common[@]}"
python -m specjax.cli distill --target "$work/target" --draft "$work/draft_pretrained" \
  --out "$work/draft_distilled" --steps "$k_steps" --learning-rate 1e-3 --warmup-steps 100 \
  --divergence fkl ${MAX_SECONDS_DISTILL:+--max-seconds $MAX_SECONDS_DISTILL} "${common[@]}"
python -m benchmarks.decoding.bundled_pair --target "$work/target" \
  --draft "pretrained=$work/draft_pretrained" --draft "distilled=$work/draft_distilled" \
  --ks 2 4 6 8 --no-timing --name "${RESULTS_NAME:-bundled_pair_acceptance_$(python -c 'import jax; print(jax.default_backend())')}"
if [ -n "${INSTALL_TO:-}" ]; then
  for pair in "target:target" "draft_distilled:draft"; do
    src="$work/${pair%%:*}" dst="$INSTALL_TO/${pair##*:}"
    rm -rf "$dst" && mkdir -p "$dst"
    cp -r "$src/config.json" "$src/metadata.json" "$src/params" "$dst/"
    cp "$src/run/history.jsonl" "$dst/history.jsonl"
  done
fi
