#!/usr/bin/env bash
# The benchmark suite on one GPU: same entry point, same files (suite_<mode>_gpu.*).
#   OUT=/some/dir bash benchmarks/machines/gpu.sh [--quick|--full]
# Run it when a session is lent the GPU machine; commit the results with the machine named
# (nvidia-smi's line is saved beside them).
set -euo pipefail
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu_machine.txt"
pip install --no-deps --no-build-isolation -q -e . 2>&1 | tail -2 || true
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python -m benchmarks.run "${1:---quick}" --no-peers   # no PyTorch on the GPU machine
cp benchmarks/results/suite_*_gpu.* "$out/" 2>/dev/null || true
