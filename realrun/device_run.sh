#!/usr/bin/env bash
# The committed real runs, in one device call (one H200): provenance, a decode-step correctness
# check per method, then 3 configurations x 3 methods x 2 arrival rates.  Everything lands in
# $OUT/realrun_traces.tar.gz (re-packed after each configuration, so a cut-off call still returns
# what finished) plus $OUT/realrun.log.
# usage (repository root): bash realrun/device_run.sh GIT_REV
#   REALRUN_METHODS="baseline" re-records only those methods; REALRUN_SKIP_CHECK=1 skips the check step.
#
# Rates (one H200; prompts uniform 1024-8192, outputs 16-128; estimates from ~600 TFLOP/s GEMM and
# ~4 TB/s, see the final report): per request, 8B prefill ~0.12 s (HACK prefill kernel ~0.18 s),
# baseline KV 0.60 GB = 0.48 s at 10 Gbps, 0.12 s at 40 Gbps; 2-bit KV ~6x less.
#   8B @ 10 Gbps: the FP16 baseline is link-bound (max ~2.1 req/s): 1.0 (link 48 % busy) and
#                 1.6 req/s (77 %: it queues); 20 requests per run (~35 s a method).
#   8B @ 40 Gbps: prefill-bound: 1.5 and 3.0 req/s (HACK prefill ~55 % busy at 3.0); 24 requests.
#   70B shapes, 8 layers @ 10 Gbps: 2.0 and 3.5 req/s (KV 32 KiB/token: baseline link 42 %); 24.
# max-decode-batch 24 >= requests per run, so the batch limit never binds; KV capacity 16 GiB.
# Expected: ~7 min in all (check + Triton compiles ~1.5 min, runs ~5.5 min); per-step timeouts
# sum to 580 s, so give the device call timeout_s=600.
set -o pipefail
export PYTHONUNBUFFERED=1 HACKSIM_GIT_REV="${1:-unknown}"
: "${OUT:?set OUT}"
mkdir -p "$OUT"
WORK=$(mktemp -d)
T="$WORK/realrun_traces"
mkdir -p "$T"
LOG="$T/realrun.log"
pack() {
  cp "$LOG" "$OUT/realrun.log"
  tar -czf "$OUT/partial.tar.gz" -C "$WORK" realrun_traces && mv "$OUT/partial.tar.gz" "$OUT/realrun_traces.tar.gz"
}
step() {  # step TIMEOUT_S LABEL CMD...
  local lim=$1 label=$2; shift 2
  echo "== $label ($(date -u +%T), limit ${lim}s): $*" | tee -a "$LOG"
  local t0=$SECONDS
  timeout "$lim" "$@" 2>&1 | grep -v "RuntimeWarning\|output = op(" | tee -a "$LOG"
  LAST_RC=${PIPESTATUS[0]}
  echo "== $label: exit $LAST_RC after $((SECONDS - t0)) s" | tee -a "$LOG"
  pack
}
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,memory.total --format=csv
  python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, torch.cuda.get_device_name())"
  echo "git_rev $HACKSIM_GIT_REV"
} 2>&1 | tee -a "$LOG"

COMMON=(--seed 1 --kv-capacity-gib 16 --prompt-range 1024 8192 --output-range 16 128
        --max-decode-batch 24 --prefill-max-batch-requests 1 --time-limit-s 100 --keep-going)
M8=(--model llama-3.1-8b)
M70=(--model llama-3.1-70b --layers 8)
CHECK=(--model llama-3.1-8b --layers 2 --prompts 1000 333 1537)
N1=20; N=24
if [ "${REALRUN_SMOKE:-0}" = 1 ]; then   # CPU plumbing check of this script: tiny model, tiny lengths
  COMMON=(--seed 1 --kv-capacity-gib 1 --prompt-range 20 100 --output-range 2 4 --max-decode-batch 8
          --time-limit-s 100 --keep-going --device cpu)
  M8=(--model tiny); M70=(--model tiny --layers 1); CHECK=(--model tiny --layers 1 --prompts 40 97 130 --device cpu)
  N1=3; N=3
fi
METHODS=(${REALRUN_METHODS:-baseline kvquant hack})
[ "${REALRUN_SKIP_CHECK:-0}" = 1 ] || step 90 check python3 -m realrun.check "${CHECK[@]}"
# fail fast: the whole harness (CUDA graphs, paced link thread, admission) on 2 layers and 3 short
# requests per method; if it breaks, stop here rather than spend the call on timeouts
SMOKE=(--model llama-3.1-8b --layers 2 --prompt-range 256 600 --output-range 4 8)
[ "${REALRUN_SMOKE:-0}" = 1 ] && SMOKE=(--model tiny --layers 1 --prompt-range 20 60 --output-range 2 3 --device cpu)
step 60 smoke python3 -m realrun --method "${METHODS[@]}" "${SMOKE[@]}" --link-gbps 10 --rate 4 \
  --requests 3 --seed 5 --kv-capacity-gib 4 --time-limit-s 30 --out "$WORK/smoke"
if [ "$LAST_RC" != 0 ] || [ "$(find "$WORK/smoke" -name requests.csv | wc -l)" != "${#METHODS[@]}" ]; then
  echo "== smoke failed: stopping" | tee -a "$LOG"; pack; exit 1
fi
step 220 8b-10gbps python3 -m realrun --method "${METHODS[@]}" "${M8[@]}" --link-gbps 10 \
  --rate 1.0 1.6 --requests $N1 "${COMMON[@]}" --out "$T"
step 140 8b-40gbps python3 -m realrun --method "${METHODS[@]}" "${M8[@]}" --link-gbps 40 \
  --rate 1.5 3.0 --requests $N "${COMMON[@]}" --out "$T"
step 130 70b8-10gbps python3 -m realrun --method "${METHODS[@]}" "${M70[@]}" \
  --link-gbps 10 --rate 2.0 3.5 --requests $N "${COMMON[@]}" --out "$T"
echo "== done $(date -u +%T), $SECONDS s" | tee -a "$LOG"
pack
