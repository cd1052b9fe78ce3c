#!/usr/bin/env bash
# One GPU session: train the bundled pair (time-boxed phases, resumable), measure its
# acceptance, and run the quick speculative-vs-plain benchmark. Results go to $OUT.
#   OUT=/some/dir bash benchmarks/machines/gpu_bundled.sh
set -uo pipefail
out="${OUT:?set OUT}"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$out/gpu.txt"
python -c "import jax, flax, optax, orbax.checkpoint as o; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())" | tee -a "$out/gpu.txt"
pip install --no-deps --no-build-isolation -q -e . 2>&1 | tail -2
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
start=$(date +%s)
work="${WORK:-/tmp/bundled_work_$start}"  # fresh unless WORK names one to resume
CORPUS=data/corpus MAX_SECONDS_TARGET=${MAX_SECONDS_TARGET:-150} MAX_SECONDS_DRAFT=${MAX_SECONDS_DRAFT:-50} \
  MAX_SECONDS_DISTILL=${MAX_SECONDS_DISTILL:-60} RESULTS_NAME=bundled_pair_acceptance_gpu \
  INSTALL_TO="$out/checkpoints" bash models/recipes/train_bundled.sh "$work" 2>&1 \
  | tr '\r' '\n' | grep -v '^train \[\|^distill \[' > "$out/train.log"
echo "training+acceptance took $(( $(date +%s) - start ))s" | tee -a "$out/train.log"
tail -20 "$out/train.log"
cp benchmarks/results/bundled_pair_acceptance_gpu.* "$out/" 2>/dev/null
for phase in target draft_pretrained draft_distilled; do
  cp "$work/$phase/run/history.jsonl" "$out/history_$phase.jsonl" 2>/dev/null
done
# Checkpoints come back as an archive in 4 MB pieces (the device returns small plain
# files): reassemble with `cat checkpoints.tar.part-* | tar -x`.
tar -cf - -C "$out" checkpoints | split -b 4M - "$out/checkpoints.tar.part-" && rm -rf "$out/checkpoints"
if [ -n "${WITH_TRUNCATED_BENCH:-}" ]; then
  timeout 100 python -m benchmarks.decoding.speculative_vs_ar --quick --name speculative_vs_ar_truncated_gpu \
    && cp benchmarks/results/speculative_vs_ar_truncated_gpu.* "$out/"
fi
ls -la "$out"
