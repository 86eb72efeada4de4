#!/usr/bin/env bash
# One device call: provenance, kernel tests on the GPU, benchmark, accuracy, profile sweep.
# usage: bash kernels_calibration/device_run.sh GIT_REV MODE   (MODE: quick | bench | final | profile)
# GIT_REV is recorded in every row (the device's copy of the checkout may not carry the history).
set -u
export PYTHONUNBUFFERED=1 HACKSIM_GIT_REV="$1"
MODE="${2:-quick}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a "$OUT/gpu.txt"
if [ "$MODE" = "quick" ] || [ "$MODE" = "bench" ] || [ "$MODE" = "final" ]; then
  timeout 120 python3 -m pytest tests/kernels -x -q -p no:cacheprovider 2>&1 | tail -25 | tee "$OUT/pytest.txt"
fi
if [ "$MODE" = "quick" ]; then
  timeout 300 python3 -m kernels_calibration.bench --out "$OUT/bench" --quick 2>&1 | tee "$OUT/bench.log"
elif [ "$MODE" = "bench" ]; then
  timeout 280 python3 -m kernels_calibration.bench --out "$OUT/bench" 2>&1 | tee "$OUT/bench.log"
  timeout 90 python3 -m kernels_calibration.accuracy --out "$OUT/bench" 2>&1 | tail -5 | tee -a "$OUT/bench.log"
elif [ "$MODE" = "final" ]; then
  timeout 270 python3 -m kernels_calibration.bench --out "$OUT/bench" 2>&1 | grep -v "^    tune" | tee "$OUT/bench.log"
  timeout 170 python3 -m kernels_calibration.profile --out "$OUT/profile" 2>&1 | grep "^fit\|rror" | tee "$OUT/profile.log"
elif [ "$MODE" = "profile" ]; then
  timeout 540 python3 -m kernels_calibration.profile --out "$OUT/profile" ${PROFILE_ARGS:-} 2>&1 | tee "$OUT/profile.log"
fi
