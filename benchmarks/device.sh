#!/usr/bin/env bash
# The one script to run when a session is lent an accelerator (at most 8 minutes of
# device time): the verify-cost curve v(K) and the decode-phase speedups of the main
# drafters, written into $OUT (benchmarks/results/device by default). Commit the results
# with the machine named (the accelerator's line is saved beside them).
#   OUT=/some/dir bash benchmarks/device.sh            # on the device machine
#   OUT=/tmp/x bash benchmarks/device.sh --dry-run     # CI-sized, on CPU (a test runs it)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-benchmarks/results/device}"
mkdir -p "$out"
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/machine.txt"
else
  grep -m1 "model name" /proc/cpuinfo | tee "$out/machine.txt" || true
fi
python="${PYTHON:-python}"
if ! "$python" -c "import specjax, specjax_models" 2> /dev/null; then
  pip install --no-deps --no-build-isolation -q -e . 2>&1 | tail -2 || true
fi
if ! "$python" -c "import specjax_models" 2> /dev/null; then
  # The editable install may not take without build isolation (the device machine has no
  # network): the models package is the folder models/, imported as specjax_models.
  shim="$(mktemp -d)"
  ln -s "$PWD/models" "$shim/specjax_models"
  export PYTHONPATH="$shim${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# 7 minutes of measuring, then nothing new starts; compile time counts.
"$python" -m benchmarks.machines.device --out "$out" --budget-s "${BUDGET_S:-420}" "$@"
