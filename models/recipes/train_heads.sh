#!/usr/bin/env bash
# Train the bundled target's feature drafters (EAGLE-3, Medusa, EAGLE-1, MTP, Kangaroo's
# adapter) by self-distillation and install them in models/checkpoints/<method>.
# Resumable: rerun the same command and each head continues from its latest checkpoint
# (the generated data is cached in WORK_DIR and shared by the runs).
#
#   bash models/recipes/train_heads.sh WORK_DIR             # the bundled recipe (CPU: ~1 h)
#   SCALE=tiny bash models/recipes/train_heads.sh WORK_DIR  # a smoke test of the pipeline
#
# Env: METHODS (default "eagle3 medusa eagle mtp kangaroo"), STEPS_<METHOD> (e.g. STEPS_EAGLE3),
# MAX_SECONDS (per head; stop early with a checkpoint, rerun to resume), NO_INSTALL=1.
set -euo pipefail
work="${1:?usage: train_heads.sh WORK_DIR}"
mkdir -p "$work"
here="$(cd "$(dirname "$0")" && pwd)"
if [ "${SCALE:-full}" = tiny ]; then
  common=(--sequences 32 --seq-len 48 --prompt-len 16 --batch-size 8 --eval-batches 1
          --eval-every 2 --checkpoint-every 2 --log-every 1)
  default_steps=2
else
  # 64 corpus tokens + 192 generated: spans like the held-out prompts' continuations.
  common=(--sequences 2048 --seq-len 256 --prompt-len 64 --batch-size 16 --eval-batches 4
          --eval-every 100 --checkpoint-every 100 --log-every 20 --warmup-steps 50)
  default_steps=600
fi
for method in ${METHODS:-eagle3 medusa eagle mtp kangaroo}; do
  upper=$(echo "$method" | tr '[:lower:]' '[:upper:]')
  steps_var="STEPS_${upper}"
  steps=${!steps_var:-$default_steps}
  out="$work/$method"
  mkdir -p "$out"
  # Every head trains on the same generated continuations.
  if [ ! -e "$out/data.npz" ] && [ -e "$work/data.npz" ]; then cp "$work/data.npz" "$out/"; fi
  python -m specjax.cli train-drafter --method "$method" --out "$out" --steps "$steps" \
    ${MAX_SECONDS:+--max-seconds $MAX_SECONDS} "${common[@]}"
  [ -e "$work/data.npz" ] || cp "$out/data.npz" "$work/data.npz"
  if [ -z "${NO_INSTALL:-}" ]; then
    mkdir -p "$here/../checkpoints/$method"
    cp "$out/head.json" "$out/head.npz" "$out/metadata.json" "$here/../checkpoints/$method/"
    cp "$out/run/history.jsonl" "$here/../checkpoints/$method/history.jsonl" 2>/dev/null || true
  fi
done
