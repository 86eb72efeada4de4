#!/usr/bin/env bash
# The committed real runs with the decode step as CUDA graphs (realrun/traces/h200_graphs/), in two
# device calls on one H200: checks first, then the configurations, 150 requests per trace, FP16
# baseline, KVQuant-style 2-bit and HACK.  Everything lands in $OUT/realrun_traces.tar.gz (re-packed
# after each configuration and every 20 s, so a cut-off call still returns what finished) plus
# $OUT/realrun.log and the part's own files.
# usage (repository root): bash realrun/device_run.sh GIT_REV PART
#   PART = 8b | 70b | 70b-traces (the h200_graphs set) | noise | kvsat (the h200_repeats set, below) | hostlink
#          | transient | duty | noise70b25 | noise8b25 | xfer | dutylong | mix | place | long | long70 | prefill | translong | shortpre | dutysat | pbatch | pbsession | mix2 | again1 | again2 | h100 | h100b | h100f | pin | midlink | midlink100 | xferpre | xferwide | firstseen | order8b | graphs1 | graphs2
#          | cpustate | h100new | h100long
#   REALRUN_SMOKE=1: the same steps on the CPU with the tiny model (plumbing check of this script).
#
# Trace durations: the simulator on each scenario (scenarios/measured/h200g_*.yaml) with realrun's own
# workload (same seed, rate and ranges); spans are set by the arrivals (150 / rate) plus the drain.
#   part 8b:  check (8B and 70B shapes, 2 layers, graph vs eager, ~90 s with Triton compiles),
#             smoke (~30 s), impl_bench (~40 s),
#             h200g_8b_mem   r7.5 / r8.5  spans ~27 / ~26 s  (decode memory saturated, KVQuant dequant
#                                                             ~25 % of JCT, batches to 48-64)
#             h200g_8b_sat   r9   / r11   spans ~19 / ~16 s  (0.75 / 0.9 of the baseline's ~12.3 req/s)
#             ~40 s of start-up, capture and priming per configuration: ~510 s in all.
#   part 70b: check (70B shapes, 2 layers), impl_bench (~30 s), hostcal --decode-mode graphs (~40 s),
#             h200g_70b8l_dq      r7.3 / r8.8  spans ~23 / ~20 s  (0.75 / 0.9 of ~9.8 req/s; dequant ~8 %)
#             h200g_70b8l_1gbps   r8           span ~20 s          (baseline link 80 % busy)
#             h200g_70b8l_2.5gbps r10          span ~16 s          (baseline link 80 % busy)
#             a dry run of --placement separate (issue 22) with both processes on this GPU (~60 s)
#             h200g_8b_2.5gbps    r7.5         span ~22 s          (last: cut first if time runs out)
#             ~600 s in all: the budget guard cuts the last configuration if the others run long.
#   part noise: smoke, the decode step's graph replay kernel by kernel (realrun.stepprof, ~40 s),
#             hostcal with the link idle and kept busy at 50 Gbps (~80 s), then, FP16 and HACK three times each
#             (same seed, back to back in one process) and KVQuant-style once:
#             h200g_8b_small      r5  80 requests  span ~16 s  (decode batches 1-16)
#             h200g_70b8l_1gbps   r8  150 requests span ~20 s  (link-bound; FP16 and HACK only)
#   part hostlink: hostcal on the 32-layer 8B with the link idle and busy at 2.5, 10 and 40 Gbps, 128-384- and
#             1024-3072-token prompts, then the 2-layer 8B at every load and range (~490 s).
#   part satnoise: smoke, h200g_8b_sat r9 150 requests span ~19 s, FP16 and HACK three times, KVQuant-style once;
#             h200g_8b_mem r7.5 HACK three times (span ~27 s) with what is left.
#   part transient: realrun.transient, decode iterations by their distance from a prefill on the shared GPU, link
#             idle: the 32-layer 8B and the 8-layer 70B, FP16 / KVQuant-style / HACK at batches 8 and 32 (~300 s).
#   part translong: realrun.transient with 1,024-, 8,192- and 16,384-token prefills (0.05-0.9 s), 32 iterations after
#             each, batch 32, every method: the 32-layer 8B and the 8-layer 70B, clocks logged (~400 s).
#   part shortpre: realrun.prefillcal and realrun.transient at 128-512-token prompts on the 32- and 8-layer 8B and the
#             8-layer 70B, every method: the short prefills' host floor alone and between decode iterations (~400 s).
#   part duty: realrun.transient --duty, decode iterations through 2-second blocks holding the prefills' share of the
#             GPU at 0, 0.5, 0, 0.25, 0, 0.5, 0 (2,048-token prefills, link idle): the 32-layer 8B and the 8-layer 70B,
#             FP16 and HACK at batch 32 (~200 s).
#   part dutylong: as duty through 3-second blocks at 0, 0.5, 0.5, 0.5, 0, 0, 0.25, 0.25, 0 (a sustained share as
#             long as a saturated recording's, then its fall), with the GPU's clocks, temperature and power logged
#             every 100 ms (smi.csv; the duty rows' unix_s lines them up) (~250 s).
#   part dutysat: as dutylong through 3-second blocks at 0, then 0.5 for 24 s, then 0, 0 (a saturated recording's sustained
#             share, longer than dutylong's 9 s: does the slowdown keep building, and on what time constant), the GPU's
#             clocks, temperature and power logged every 100 ms (smi_dutysat.csv) (~200 s).
#   part pbatch: smoke, then h200g_8b_pbatch r14 (prefill batches of up to 4 requests, 256-1,024-token prompts,
#             32-160-token outputs, 25 Gbps, 150 requests, every method): a configuration never measured (~200 s).
#   part pbsession: smoke, then h200g_8b_pbatch r14 again (every method), h200g_8b_2.5gbps r7.5 and h200g_8b_sat r9
#             (FP16 and HACK, once each) in the same session, so a machine factor fitted on the two known
#             configurations can be tried on the batched one (~520 s; the budget guard cuts the last).
#   part again1 / again2 (two calls on one warm machine, one session): smoke, then again1: h200g_8b_sat r9 (FP16, HACK),
#             h200g_8b_mem r8.5, h200g_8b_2.5gbps r7.5 and h200g_8b_small r5 (80 requests), every method once (~500 s);
#             again2: h200g_8b_light r2 (40 requests) and h200g_8b_long r1 (40 requests, batches to 32), step-timed as
#             their first recordings, then h200g_70b8l_dq r8.8, every method once (~550 s; the budget guard cuts the last).
#   part graphs1 / graphs2 (two calls on one warm machine, one session): smoke, then graphs1: h200g_8b_sat r9,
#             h200g_8b_mem r8.5 and h200g_8b_2.5gbps r7.5; graphs2: h200g_70b8l_dq r8.8, h200g_70b8l_1gbps r8 and
#             h200g_70b8l_2.5gbps r10; every method once (~450 / ~400 s): the six h200_graphs configurations in one
#             session, so each is priced with a machine factor from the other five.
#   part h100 (on an H100): smoke, then h100g_8b_2.5gbps r7.5, h100g_8b_small r5 (80 requests), h100g_8b_mem r6 and
#             h100g_70b8l_1gbps r8, every method once: the h200g configurations that fit 80 GB, on a GPU never measured.
#   part h100b (on an H100): smoke, then h100g_8b_small r5 (80 requests), h100g_70b8l_dq r5.5 and h100g_8b_light r2
#             (40 requests), every method once: a second H100 session, two configurations no H100 run has (~500 s).
#   part h100f (on an H100): smoke, then h100g_8b_sat r8, h100g_70b8l_2.5gbps r9 and h100g_8b_kvsat r2 (60 requests),
#             every method once: three configurations no H100 run has, at the rates where the simulator puts the
#             H100's mean JCT near the H200 recordings' (~380 s).
#   part h100new (on an H100): smoke, then h100g_8b_small r5 (80 requests), h100g_8b_pbatch r10 (prefill batches of up
#             to 4) and h100g_70b8l_40gbps r20 (200 requests), every method once: two configurations no H100 run has,
#             beside one nine of the twelve earlier H100 sessions have (~360 s).
#   part h100long (on an H100): smoke, then h100g_8b_small r5 (80 requests: the session's host factor) and, with
#             H100LONG=8b (default) h100g_8b_long r0.8 (40 requests, batches to 16: 32 FP16 slots of 16.7K tokens do not
#             fit the H100 beside the 32 GiB KV pool), with H100LONG=70b h100g_70b8l_long
#             r1.2 (60 requests), every method once, step-timed as part long: long prompts no H100 run has, at the
#             rates where the simulator puts FP16's mean JCT on the H100 near the H200 recordings' (~350 s each).
#   part pin (on an H100): smoke, then h100g_8b_sat r8 HACK three times back to back with the threads where the OS puts
#             them, three times with the loop and the link thread pinned to a CPU each (--pin-threads), then KVQuant-style
#             the same (~470 s): is the host steps' run-to-run spread (HACK's packing step in two modes, 4.5 and 7 ms,
#             in stretches) the OS's placement of the threads.
#   part midlink: smoke, then h200g_8b_sat25 r8 (8b_sat's workload at 25 Gbps: FP16's link ~78 % busy, simulated) and
#             h200g_8b_short10 r12 (8b_2.5gbps's short prompts at 10 Gbps: host-bound 32-layer prefills beside a faster
#             link, FP16's link ~36 % busy), every method once: the busy link's host factor between the 2.5 and 40-50 Gbps
#             recordings, and the 32-layer prefill's host floor, the two things `validate --cv` finds only one or two
#             configurations pin down (~350 s).
#   part midlink100 (on an H100): the same two configurations on an H100: h100g_8b_sat25 r7 and h100g_8b_short10 r12
#             (rates where the simulator puts FP16's mean JCT on the H100 near the H200 ones') (~350 s).
#   part mix2: the mix runs again at batches 8-48 on both models, and the 70B at 4,096-token contexts (~450 s).
#   part mix: realrun.transient --mix, B requests of 2,048 tokens each against B spread over 1,024-3,072 (the same
#             total), 64 iterations each, link idle: the 32-layer 8B and the 8-layer 70B, every method, B = 8, 16, 32.
#   part noise70b25 / noise8b25: smoke, then h200g_70b8l_2.5gbps r10 (span ~15 s) / h200g_8b_2.5gbps r7.5 (~20 s),
#             150 requests, FP16 and HACK three times, KVQuant-style once (the run-to-run spread of the configurations
#             the h200_repeats set had not recorded).
#   part xfer: realrun.transient --xfer-gbps 2.5 10 40, the loop beside transfers on the harness's own paced link
#             (short ones of 10 ms of wire, long ones of 300 ms, none), no prefill: the 32-layer 8B and the 8-layer 70B,
#             FP16 and HACK at batch 32 (~150 s).
#   part xferwide: realrun.transient --xfer-gbps 1 2.5 5 10 25 40 60 80 100, part xfer's windows on the 32-layer 8B,
#             FP16 at batch 32 with 1 MiB chunks and again with 4 MiB (--xfer-chunk-mib): the busy link's extra
#             host time per iteration past 50 Gbps, whether it goes with the rate or with the chunks per second, and
#             whether the link keeps its rate (transfer_s) (~250 s; XW_RATES="R ..." other rates, XW_CHUNKS="MIB ..."
#             other chunk sizes, one file each).
#   part firstseen: realrun.prefillprof --first-seen 40 at 128-640, 640-1536 and 2048-4096 tokens on the 8-layer 70B and
#             the 32-layer 8B, each range in a process of its own: the first-seen prefill time and how much of it a
#             GPU-bound forward shows, on this GPU's host (~150 s).
#   part order8b: smoke, then h200g_8b_2.5gbps r7.5 150 requests with HACK first, KVQuant-style, FP16 last (~150 s;
#             h100g_8b_2.5gbps on an H100: realrun/traces/h100_order8b).
#   part xferpre: realrun.transient --xfer-gbps 2.5 10 25 40 50 --xfer-prefill 128 384, part xfer's windows plus, per
#             rate and cycle, short prefills with the link idle and 10 ms into a long transfer on the harness's own
#             link (the prefill floor's level while the link moves KV): the 32-layer 8B and the 8-layer 70B, every
#             method at batch 8, 3 cycles (~300 s).
#   HOSTPROBE=1 (any part): realrun.cpustate's pure-Python loop in the background for the whole part, into
#             $OUT/cpustate_bg.csv (the host's speed beside each recording's wall-clock span in its meta.json).
#   part cpustate: realrun.cpustate three times, 30 s each in a process of its own: a pure-Python loop and the
#             KVQuant-style quantize step of 32 layers, step after step, with the CPU, migrations and steal (does
#             the host's CPU run at one speed?) (~110 s).
#   part kvsat: smoke, h200g_8b_kvsat r2.5 60 requests span ~24 s + drain (FP16's decode memory saturated),
#             FP16 and HACK three times, KVQuant-style once.
#   part steps: smoke, then h200g_8b_sat r9 (FP16, HACK), h200g_8b_mem r8.5 (HACK), h200g_70b8l_2.5gbps r10 (HACK),
#             150 requests each, with --step-times: each iteration's host issue, KV placement and step graph on the GPU
#             (steps.csv beside each trace), to split where the saturated recordings' iterations spend their time.
#   part long: smoke, then h200g_8b_long r1 (8-16K-token prompts, 64-256-token outputs, 40 requests, decode batches
#             to 32; every method, step-timed): a configuration never measured (~300 s).
#   part long70: smoke, then h200g_70b8l_long r1.5 (8 layers of the 70B, 6-12K-token prompts, 64-256-token outputs,
#             60 requests, every method, step-timed): a configuration never measured (~330 s).
#   part prefill: realrun.prefillcal, the harness's prefill alone at 1-16K tokens, FP16 and HACK on the 32-layer 8B,
#             back to back and rested, the GPU's clocks and power logged every 100 ms (smi_prefill.csv) (~150 s).
#   part place: realrun.placecal, the KV placement copy (joins and moves, 256-16,384 tokens) against its bytes and the
#             step graph's launch CPU time: the 32- and 8-layer 8B and the 8-layer 70B, every method (~120 s).
# Each step's limit is cut to what is left of BUDGET_S, so the call ends inside its 600 s.
set -o pipefail
export PYTHONUNBUFFERED=1 HACKSIM_GIT_REV="${1:-unknown}"
PART="${2:-8b}"
: "${OUT:?set OUT}"
mkdir -p "$OUT"
BUDGET_S=${BUDGET_S:-575}
WORK=$(mktemp -d)
T="$WORK/realrun_traces"
mkdir -p "$T"
LOG="$T/realrun.log"
pack() {
  cp "$LOG" "$OUT/realrun.log" 2>/dev/null
  tar -czf "$OUT/partial.tar.gz" -C "$WORK" realrun_traces 2>/dev/null && mv "$OUT/partial.tar.gz" "$OUT/realrun_traces.tar.gz"
}
(while sleep 20; do pack; done) &
PACKER=$!
step() {  # step LIMIT_S LABEL CMD...
  local lim=$1 label=$2; shift 2
  local left=$((BUDGET_S - SECONDS))
  [ "$lim" -gt "$left" ] && lim=$left
  if [ "$lim" -lt 20 ]; then echo "== $label: skipped, ${left} s left" | tee -a "$LOG"; LAST_RC=124; return; fi
  echo "== $label ($(date -u +%T), limit ${lim}s): $*" | tee -a "$LOG"
  local t0=$SECONDS
  timeout "$lim" "$@" 2>&1 | grep -v "RuntimeWarning\|output = op(" | tee -a "$LOG"
  LAST_RC=${PIPESTATUS[0]}
  echo "== $label: exit $LAST_RC after $((SECONDS - t0)) s" | tee -a "$LOG"
  pack
}
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,memory.total --format=csv
  python3 -c "import torch, triton, numpy, scipy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, 'scipy', scipy.__version__, torch.cuda.get_device_name())"
  echo "git_rev $HACKSIM_GIT_REV part $PART"
} 2>&1 | tee -a "$LOG"

DEV=(); CHK8=(--model llama-3.1-8b --layers 2 --prompts 1000 333 1537); CHK70=(--model llama-3.1-70b --layers 2 --prompts 2500 333 1537)
SMOKE=(--model llama-3.1-8b --layers 2 --prompt-range 256 600 --output-range 4 8)
M8=(--model llama-3.1-8b); M70=(--model llama-3.1-70b --layers 8)
N=150; LIMIT_RUN=75; REC_EXTRA=()
if [ "${REALRUN_SMOKE:-0}" = 1 ]; then   # CPU plumbing check of this script: tiny model, tiny lengths
  DEV=(--device cpu); CHK8=(--model tiny --layers 1 --prompts 40 97 130); CHK70=("${CHK8[@]}")
  SMOKE=(--model tiny --layers 1 --prompt-range 20 60 --output-range 2 3)
  M8=(--model tiny --layers 1); M70=(--model tiny --layers 1); N=3; LIMIT_RUN=100
fi
# run LABEL MODEL_ARGS LINK PROMPT OUTPUT KV_GIB PARKED_GIB RATES...
config() {
  local label=$1; shift; local -n model=$1; shift
  local link=$1 p0=$2 p1=$3 o0=$4 o1=$5 kv=$6 parked=$7 lim=$8; shift 8
  local sm=(--prompt-range "$p0" "$p1" --output-range "$o0" "$o1")
  [ "${REALRUN_SMOKE:-0}" = 1 ] && sm=(--prompt-range 20 100 --output-range 2 4)
  step "$lim" "$label" python3 -m realrun --method baseline kvquant hack "${model[@]}" --link-gbps "$link" \
    --rate "$@" --requests $N --seed 1 --kv-capacity-gib "$kv" --prefill-host-memory-gib "$parked" \
    "${sm[@]}" --max-decode-batch 64 --prefill-max-batch-requests 1 --time-limit-s $LIMIT_RUN --keep-going \
    --chunk-mib 1 --label "$label" --out "$T" "${DEV[@]}"
}

# rec LABEL MODEL_ARRAY LINK P0 P1 O0 O1 KV_GIB PARKED_GIB LIMIT REQUESTS REPEATS "METHODS" RATES...
rec() {
  local label=$1; shift; local -n model=$1; shift
  local link=$1 p0=$2 p1=$3 o0=$4 o1=$5 kv=$6 parked=$7 lim=$8 n=$9 reps=${10} meths=${11}; shift 11
  local sm=(--prompt-range "$p0" "$p1" --output-range "$o0" "$o1")
  if [ "${REALRUN_SMOKE:-0}" = 1 ]; then sm=(--prompt-range 20 100 --output-range 2 4); n=3; fi
  local out="$T"  # one method, one rate, one repeat: realrun writes the trace into --out itself
  if [ "$reps" = 1 ] && [ "$(echo $meths | wc -w)" = 1 ] && [ $# = 1 ]; then out="$T/${label}_${meths}_r$1"; fi
  # shellcheck disable=SC2086  # METHODS is a word list
  step "$lim" "$label" python3 -m realrun --method $meths "${model[@]}" --link-gbps "$link" \
    --rate "$@" --requests "$n" --seed 1 --kv-capacity-gib "$kv" --prefill-host-memory-gib "$parked" \
    "${sm[@]}" --max-decode-batch "${MAXB:-64}" --prefill-max-batch-requests "${PFB:-1}" --time-limit-s $LIMIT_RUN --keep-going \
    --chunk-mib 1 --label "$label" --repeats "$reps" --out "$out" "${DEV[@]}" "${REC_EXTRA[@]}"
}
clock_log() {  # clock_log FILE: the GPU's clocks, temperature, power and throttle reasons every 100 ms into FILE, in the
  # background until `kill "$SMI"`
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_throttle_reasons.active \
    --format=csv,nounits -lms 100 > "$1" 2>&1 &
  SMI=$!
}
smoke_or_stop() {
  step 60 smoke python3 -m realrun --method baseline kvquant hack "${SMOKE[@]}" --link-gbps 10 --rate 4 \
    --requests 3 --seed 5 --kv-capacity-gib 4 --time-limit-s 30 --max-decode-batch 8 --out "$WORK/smoke" "${DEV[@]}"
  if [ "$LAST_RC" != 0 ] || [ "$(find "$WORK/smoke" -name requests.csv | wc -l)" != 3 ]; then
    echo "== smoke failed: stopping" | tee -a "$LOG"; kill $PACKER; pack; exit 1
  fi
}

if [ "${HOSTPROBE:-0}" = 1 ]; then  # the host CPU's speed beside the part (realrun.cpustate, the pure-Python loop alone,
  # on whichever CPU the OS gives it; wall_s beside each recording's wall_start_s/wall_end_s), until the part ends
  python3 -m realrun.cpustate --no-gpu --seconds 3600 --tag "bg_$PART" --out "$OUT/cpustate_bg.csv" > /dev/null 2>&1 &
  PROBE=$!
  trap 'kill -TERM "$PROBE" 2>/dev/null; wait "$PROBE"' EXIT  # it writes its rows when told to stop
fi
if [ "$PART" = noise ]; then
  # issue 27/28: small decode batches, the host time with and without link traffic, and repeated recordings
  # (realrun/traces/h200_repeats/): each (method, rate) three times back to back in one process, same seed.
  smoke_or_stop
  if [ "${REALRUN_SMOKE:-0}" = 1 ]; then HC=(--smoke --requests 4); else
    HC=(--sets "llama-3.1-8b:2;llama-3.1-70b:2")
    step 90 stepprof python3 -m realrun.stepprof --out "$OUT/stepprof_8b.csv"
  fi
  step 150 hostcal_link python3 -m realrun.hostcal --decode-mode graphs --link-load-gbps 0 50 \
    --out "$OUT/hostcal_link.csv" "${HC[@]}"
  rec h200g_8b_small M8 50 256 2048 32 256 16 16 150 80 3 "baseline hack" 5
  rec h200g_8b_small M8 50 256 2048 32 256 16 16 60 80 1 "kvquant" 5
  rec h200g_70b8l_1gbps M70 1 128 640 32 128 16 8 180 150 3 "baseline hack" 8
elif [ "$PART" = steps ]; then
  # issue 28: where a saturated recording's iterations spend their time (steps.csv beside each trace)
  smoke_or_stop
  [ "${REALRUN_SMOKE:-0}" = 1 ] || REC_EXTRA=(--step-times)  # CUDA events: not on the smoke's CPU
  rec h200g_8b_sat M8 40 1024 3072 32 160 32 16 150 150 1 "baseline hack" 9
  rec h200g_8b_mem M8 50 1024 3072 192 448 8 16 90 150 1 "hack" 8.5
  rec h200g_70b8l_2.5gbps M70 2.5 512 1024 32 128 16 8 90 150 1 "hack" 10
elif [ "$PART" = hostlink ]; then
  # issue 28: the host time per decode iteration, per prefill and per quantize step with the link idle and busy at
  # the recordings' link rates, on the recordings' 32-layer 8B at their two prompt ranges (hostcal_link_*.csv)
  if [ "${REALRUN_SMOKE:-0}" = 1 ]; then HC=(--smoke --requests 4); else HC=(--sets "llama-3.1-8b:32"); fi
  step 170 hostlink_short python3 -m realrun.hostcal --decode-mode graphs --link-load-gbps 0 2.5 40 \
    --prompt-ranges 128-384 --out "$OUT/hostcal_link_short.csv" "${HC[@]}"
  step 170 hostlink_long python3 -m realrun.hostcal --decode-mode graphs --link-load-gbps 0 40 10 \
    --prompt-ranges 1024-3072 --out "$OUT/hostcal_link_long.csv" "${HC[@]}"
  if [ "${REALRUN_SMOKE:-0}" != 1 ]; then HC=(--sets "llama-3.1-8b:2"); fi
  step 150 hostlink_2l python3 -m realrun.hostcal --decode-mode graphs --link-load-gbps 0 2.5 10 40 \
    --prompt-ranges 128-384 1024-3072 --out "$OUT/hostcal_link_2l.csv" "${HC[@]}"
elif [ "$PART" = satnoise ]; then
  # issue 28: the run-to-run spread where the GPU is near saturation (8B at 0.75 of FP16's capacity: a step's small
  # error moves JCT several times over), FP16 and HACK three times, KVQuant-style once; then HACK three times in
  # the decode-memory-bound configuration (h200g_8b_mem r7.5), if the budget leaves room
  smoke_or_stop
  rec h200g_8b_sat M8 40 1024 3072 32 160 32 16 240 150 3 "baseline hack" 9
  rec h200g_8b_sat M8 40 1024 3072 32 160 32 16 80 150 1 "kvquant" 9
  rec h200g_8b_mem M8 50 1024 3072 192 448 8 16 150 150 3 "hack" 7.5
elif [ "$PART" = transient ]; then
  # issue 28: what a prefill leaves behind on the shared GPU (transient.csv); clocks before and after
  if [ "${REALRUN_SMOKE:-0}" = 1 ]; then TR=(--smoke); TR70=(--smoke); else
    TR=(--sets "llama-3.1-8b:32"); TR70=(--sets "llama-3.1-70b:8")
  fi
  step 300 transient_8b python3 -m realrun.transient --out "$OUT/transient_8b.csv" "${TR[@]}"
  nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_throttle_reasons.active --format=csv 2>&1 | tee -a "$LOG"
  step 240 transient_70b python3 -m realrun.transient --out "$OUT/transient_70b.csv" "${TR70[@]}"
  nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_throttle_reasons.active --format=csv 2>&1 | tee -a "$LOG"
elif [ "$PART" = translong ]; then
  # issue 28: what a long prefill (8-16K tokens, 0.4-0.9 s) leaves behind on the shared GPU: the transient and the
  # clock's fade after it, beside 1,024-token prefills as the short reference (translong_*.csv); clocks logged every
  # 100 ms (smi_translong.csv)
  if [ "${REALRUN_SMOKE:-0}" = 1 ]; then TR=(--smoke); TR70=(--smoke); else
    TR=(--sets "llama-3.1-8b:32" --prompts 1024 8192 16384 --gap 32 --cycles 4 --batches 32)
    TR70=(--sets "llama-3.1-70b:8" --prompts 1024 8192 16384 --gap 32 --cycles 4 --batches 32)
  fi
  clock_log "$OUT/smi_translong.csv"
  step 280 translong_8b python3 -m realrun.transient --out "$OUT/translong_8b.csv" "${TR[@]}"
  step 280 translong_70b python3 -m realrun.transient --out "$OUT/translong_70b.csv" "${TR70[@]}"
  kill "$SMI" 2>/dev/null
elif [ "$PART" = shortpre ]; then
  # issue 28: the host floor of short-prompt prefills (128-512 tokens) on the 32- and 8-layer 8B and the 8-layer 70B,
  # each alone back to back and rested (prefillcal_short.csv) and between decode iterations of a batch of 8
  # (shortpre_*.csv): per batch against per layer on one host, and whether a decode iteration before a prefill
  # lengthens it
  if [ "${REALRUN_SMOKE:-0}" = 1 ]; then PF=(--smoke); TR=(--smoke); TR8=(--smoke); TR70=(--smoke); else
    PF=(--sets "llama-3.1-8b:32;llama-3.1-8b:8;llama-3.1-70b:8" --tokens 128 256 512 --repeats 8 --rest-s 0.3
      --methods baseline kvquant hack)
    SP=(--prompts 128 256 512 --batches 8 --gap 4 --cycles 8 --dense 0)
    TR=(--sets "llama-3.1-8b:32" "${SP[@]}"); TR8=(--sets "llama-3.1-8b:8" "${SP[@]}")
    TR70=(--sets "llama-3.1-70b:8" "${SP[@]}")
  fi
  step 150 prefillcal_short python3 -m realrun.prefillcal --out "$OUT/prefillcal_short.csv" "${PF[@]}"
  step 120 shortpre_8b python3 -m realrun.transient --out "$OUT/shortpre_8b.csv" "${TR[@]}"
  step 120 shortpre_8b8 python3 -m realrun.transient --out "$OUT/shortpre_8b8.csv" "${TR8[@]}"
  step 120 shortpre_70b python3 -m realrun.transient --out "$OUT/shortpre_70b.csv" "${TR70[@]}"
elif [ "$PART" = duty ]; then
  # issue 28: what a sustained share of prefill does to the decode iterations on the shared GPU (duty_*.csv)
  if [ "${REALRUN_SMOKE:-0}" = 1 ]; then TR=(--smoke); TR70=(--smoke); else
    TR=(--sets "llama-3.1-8b:32"); TR70=(--sets "llama-3.1-70b:8")
  fi
  nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv 2>&1 | tee -a "$LOG"
  step 250 duty_8b python3 -m realrun.transient --duty --methods baseline hack --batches 32 \
    --out "$OUT/duty_8b.csv" "${TR[@]}"
  nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv 2>&1 | tee -a "$LOG"
  step 250 duty_70b python3 -m realrun.transient --duty --methods baseline hack --batches 32 \
    --out "$OUT/duty_70b.csv" "${TR70[@]}"
elif [ "$PART" = dutylong ]; then
  # issue 28: does a sustained share of prefill slow the decode iterations beyond the transient after each prefill,
  # and how fast does that fade (dutylong_*.csv, smi.csv)
  if [ "${REALRUN_SMOKE:-0}" = 1 ]; then TR=(--smoke); TR70=(--smoke); else
    TR=(--sets "llama-3.1-8b:32"); TR70=(--sets "llama-3.1-70b:8")
  fi
  DL=(--duty 0 0.5 0.5 0.5 0 0 0.25 0.25 0 --block-s 3 --methods baseline hack --batches 32)
  clock_log "$OUT/smi.csv"
  step 270 dutylong_8b python3 -m realrun.transient "${DL[@]}" --out "$OUT/dutylong_8b.csv" "${TR[@]}"
  step 270 dutylong_70b python3 -m realrun.transient "${DL[@]}" --out "$OUT/dutylong_70b.csv" "${TR70[@]}"
  kill "$SMI" 2>/dev/null
elif [ "$PART" = dutysat ]; then
  # issue 28: the third 50 % block of dutylong ran 1.5-3.8 points slower than the first two on every set and method
  # (against the context's own growth): whether a sustained share keeps slowing the decode iterations (dutysat_*.csv,
  # smi_dutysat.csv)
  if [ "${REALRUN_SMOKE:-0}" = 1 ]; then TR=(--smoke); TR70=(--smoke); DS=(--block-s 0.2); else
    TR=(--sets "llama-3.1-8b:32"); TR70=(--sets "llama-3.1-70b:8"); DS=(--block-s 3)
  fi
  DS+=(--duty 0 0.5 0.5 0.5 0.5 0.5 0.5 0.5 0.5 0 0 --methods baseline hack --batches 32)
  clock_log "$OUT/smi_dutysat.csv"
  step 270 dutysat_8b python3 -m realrun.transient "${DS[@]}" --out "$OUT/dutysat_8b.csv" "${TR[@]}"
  step 270 dutysat_70b python3 -m realrun.transient "${DS[@]}" --out "$OUT/dutysat_70b.csv" "${TR70[@]}"
  kill "$SMI" 2>/dev/null
elif [ "$PART" = mix ]; then
  # issue 28: does a batch of spread contexts (a recording's) cost more than its total prices (mix_*.csv)
  if [ "${REALRUN_SMOKE:-0}" = 1 ]; then TR=(--smoke); TR70=(--smoke); else
    TR=(--sets "llama-3.1-8b:32" --batches 8 16 32); TR70=(--sets "llama-3.1-70b:8" --batches 8 16 32)
  fi
  step 270 mix_8b python3 -m realrun.transient --mix --out "$OUT/mix_8b.csv" "${TR[@]}"
  step 270 mix_70b python3 -m realrun.transient --mix --out "$OUT/mix_70b.csv" "${TR70[@]}"
elif [ "$PART" = mix2 ]; then
  # issue 28: the mix probe again, with more batch sizes (the attention's padding share, realrun.transient --fit:
  # the 8B's FP16 share sat at twice its standard error, the 8-layer 70B's were not resolved), and the 70B at twice the
  # context (twice the padding per request)
  if [ "${REALRUN_SMOKE:-0}" = 1 ]; then TR=(--smoke); TR70=(--smoke); TR70L=(--smoke); else
    TR=(--sets "llama-3.1-8b:32" --batches 8 16 24 32 48); TR70=(--sets "llama-3.1-70b:8" --batches 8 16 24 32 48)
    TR70L=(--sets "llama-3.1-70b:8" --batches 16 32 --context 4096)
  fi
  step 240 mix2_8b python3 -m realrun.transient --mix --out "$OUT/mix2_8b.csv" "${TR[@]}"
  step 180 mix2_70b python3 -m realrun.transient --mix --out "$OUT/mix2_70b.csv" "${TR70[@]}"
  step 120 mix2_70b_4k python3 -m realrun.transient --mix --out "$OUT/mix2_70b_4k.csv" "${TR70L[@]}"
elif [ "$PART" = noise70b25 ]; then
  smoke_or_stop
  rec h200g_70b8l_2.5gbps M70 2.5 512 1024 32 128 16 8 300 150 3 "baseline hack" 10
  rec h200g_70b8l_2.5gbps M70 2.5 512 1024 32 128 16 8 90 150 1 "kvquant" 10
elif [ "$PART" = noise8b25 ]; then
  smoke_or_stop
  rec h200g_8b_2.5gbps M8 2.5 128 384 32 128 16 8 300 150 3 "baseline hack" 7.5
  rec h200g_8b_2.5gbps M8 2.5 128 384 32 128 16 8 90 150 1 "kvquant" 7.5
elif [ "$PART" = xfer ]; then
  if [ "${REALRUN_SMOKE:-0}" = 1 ]; then TR=(--smoke); TR70=(--smoke); else
    TR=(--sets "llama-3.1-8b:32"); TR70=(--sets "llama-3.1-70b:8")
  fi
  step 200 xfer_8b python3 -m realrun.transient --xfer-gbps 2.5 10 40 --methods baseline hack --batches 32 \
    --out "$OUT/xfer_8b.csv" "${TR[@]}"
  step 200 xfer_70b python3 -m realrun.transient --xfer-gbps 2.5 10 40 --methods baseline hack --batches 32 \
    --out "$OUT/xfer_70b.csv" "${TR70[@]}"
elif [ "$PART" = xferwide ]; then
  if [ "${REALRUN_SMOKE:-0}" = 1 ]; then TR=(--smoke); else TR=(--sets "llama-3.1-8b:32"); fi
  read -r -a XW <<< "${XW_RATES:-1 2.5 5 10 25 40 60 80 100}"
  for c in ${XW_CHUNKS:-1 4}; do
    step 150 "xferwide_8b_${c}m" python3 -m realrun.transient --xfer-gbps "${XW[@]}" \
      --xfer-chunk-mib "$c" --methods baseline --batches 32 --out "$OUT/xferwide_8b_${c}m.csv" "${TR[@]}"
  done
elif [ "$PART" = firstseen ]; then
  # the first-seen prefill time on this GPU's host: each range in a process of its own (the kernel choices are kept
  # per process), the 8-layer 70B and the 32-layer 8B, 40 lengths each, first sight then again
  if [ "${REALRUN_SMOKE:-0}" = 1 ]; then FS=(--smoke --first-seen 3); else FS=(--first-seen 40 --sets "llama-3.1-70b:8;llama-3.1-8b:32"); fi
  for r in "128 640" "640 1536" "2048 4096"; do
    read -r lo hi <<< "$r"
    step 120 "firstseen_${lo}_${hi}" python3 -m realrun.prefillprof "${FS[@]}" --first-seen-range "$lo" "$hi" \
      --out "$OUT/prefillprof_firstseen_${lo}_${hi}.csv"
  done
elif [ "$PART" = order8b ]; then
  # issue 28: the method-order check on the H200 at the host-bound short prompts (h100_order is the 70B's, on an
  # H100): h200g_8b_2.5gbps with HACK first and FP16 last, the reverse of h200_graphs' order
  smoke_or_stop
  # labelled for the GPU that came (the h100g scenario's flags are the same): a trace's name says its machine
  lab=h200g; if nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H100; then lab=h100g; fi
  rec ${lab}_8b_2.5gbps M8 2.5 128 384 32 128 16 8 150 150 1 "hack kvquant baseline" 7.5
elif [ "$PART" = xferpre ]; then
  if [ "${REALRUN_SMOKE:-0}" = 1 ]; then TR=(--smoke); TR70=(--smoke); else
    TR=(--sets "llama-3.1-8b:32"); TR70=(--sets "llama-3.1-70b:8")
  fi
  step 240 xferpre_8b python3 -m realrun.transient --xfer-gbps 2.5 10 25 40 50 --xfer-prefill 128 384 --batches 8 \
    --cycles 3 --out "$OUT/xferpre_8b.csv" "${TR[@]}"
  step 240 xferpre_70b python3 -m realrun.transient --xfer-gbps 2.5 10 25 40 50 --xfer-prefill 128 384 --batches 8 \
    --cycles 3 --out "$OUT/xferpre_70b.csv" "${TR70[@]}"
elif [ "$PART" = cpustate ]; then
  if [ "${REALRUN_SMOKE:-0}" = 1 ]; then CS=(--seconds 1 --no-gpu); else CS=(--seconds 30); fi
  for i in 1 2 3; do
    step 60 "cpustate$i" python3 -m realrun.cpustate --out "$OUT/cpustate.csv" --tag "run$i" "${CS[@]}"
  done
elif [ "$PART" = long ]; then
  # issue 28: a configuration never measured, long prompts (8-16K tokens): does the calibration carry there
  smoke_or_stop
  [ "${REALRUN_SMOKE:-0}" = 1 ] || REC_EXTRA=(--step-times)
  MAXB=32  # the slot pool holds max batch x 16.7K tokens: 64 FP16 slots would not fit; 32 GiB of KV holds <= 31
  rec h200g_8b_long M8 40 8192 16384 64 256 32 16 420 40 1 "baseline kvquant hack" 1
elif [ "$PART" = pbatch ]; then
  # issue 28: a configuration never measured: prefill batches of several requests (every committed recording
  # prefills one request at a time)
  smoke_or_stop
  PFB=4 rec h200g_8b_pbatch M8 25 256 1024 32 160 16 8 240 150 1 "baseline kvquant hack" 14
elif [ "$PART" = pbsession ]; then
  # issue 28: the batched-prefill configuration beside two known ones in one session (a machine factor that carries)
  smoke_or_stop
  PFB=4 rec h200g_8b_pbatch M8 25 256 1024 32 160 16 8 230 150 1 "baseline kvquant hack" 14
  rec h200g_8b_2.5gbps M8 2.5 128 384 32 128 16 8 150 150 1 "baseline hack" 7.5
  rec h200g_8b_sat M8 40 1024 3072 32 160 32 16 150 150 1 "baseline hack" 9
elif [ "$PART" = again1 ] || [ "$PART" = again2 ]; then
  # issue 28: the configurations whose held-out errors miss (8b_mem, 8b_2.5gbps) or that one session alone recorded
  # (8b_small, 8b_light, 8b_long, 70b8l_dq) recorded again, in one device session beside a known anchor (8b_sat), so
  # each has session-mates a machine factor can be fitted on; two calls back to back on one warm machine
  smoke_or_stop
  if [ "$PART" = again1 ]; then
    rec h200g_8b_sat M8 40 1024 3072 32 160 32 16 100 150 1 "baseline hack" 9
    rec h200g_8b_mem M8 50 1024 3072 192 448 8 16 150 150 1 "baseline kvquant hack" 8.5
    rec h200g_8b_2.5gbps M8 2.5 128 384 32 128 16 8 120 150 1 "baseline kvquant hack" 7.5
    rec h200g_8b_small M8 50 256 2048 32 256 16 16 110 80 1 "baseline kvquant hack" 5
  else
    [ "${REALRUN_SMOKE:-0}" = 1 ] || REC_EXTRA=(--step-times)  # as the first recordings of 8b_light and 8b_long
    rec h200g_8b_light M8 40 1024 3072 192 448 32 16 130 40 1 "baseline kvquant hack" 2
    MAXB=32 rec h200g_8b_long M8 40 8192 16384 64 256 32 16 330 40 1 "baseline kvquant hack" 1
    REC_EXTRA=()
    rec h200g_70b8l_dq M70 25 2048 4096 128 320 24 16 120 150 1 "baseline kvquant hack" 8.8
  fi
elif [ "$PART" = graphs1 ] || [ "$PART" = graphs2 ]; then
  # issue 28: every h200_graphs configuration in one device session (the H200's counterpart of h100_probe)
  smoke_or_stop
  if [ "$PART" = graphs1 ]; then
    rec h200g_8b_sat M8 40 1024 3072 32 160 32 16 150 150 1 "baseline kvquant hack" 9
    rec h200g_8b_mem M8 50 1024 3072 192 448 8 16 150 150 1 "baseline kvquant hack" 8.5
    rec h200g_8b_2.5gbps M8 2.5 128 384 32 128 16 8 120 150 1 "baseline kvquant hack" 7.5
  else
    rec h200g_70b8l_dq M70 25 2048 4096 128 320 24 16 130 150 1 "baseline kvquant hack" 8.8
    rec h200g_70b8l_1gbps M70 1 128 640 32 128 16 8 130 150 1 "baseline kvquant hack" 8
    rec h200g_70b8l_2.5gbps M70 2.5 512 1024 32 128 16 8 120 150 1 "baseline kvquant hack" 10
  fi
elif [ "$PART" = h100 ]; then
  # issue 28: a GPU and host no fit has seen (an H100 of 80 GB: configurations whose slot pool and KV fit it), priced
  # with the H100 profile (kernels_calibration/profiles/h100: derived from the H200's when these ran, measured
  # since) and the H200-fitted engine
  smoke_or_stop
  rec h100g_8b_2.5gbps M8 2.5 128 384 32 128 16 8 120 150 1 "baseline kvquant hack" 7.5
  rec h100g_8b_small M8 50 256 2048 32 256 16 16 150 80 1 "baseline kvquant hack" 5  # 110 s cut its HACK run (2026-12-05)
  rec h100g_8b_mem M8 50 1024 3072 192 448 8 16 150 150 1 "baseline kvquant hack" 6
  rec h100g_70b8l_1gbps M70 1 128 640 32 128 16 8 120 150 1 "baseline kvquant hack" 8
elif [ "$PART" = h100b ]; then
  # issue 28: a second H100 session: 8b_small again (FP16 and KVQuant-style as in the first, HACK, which the first
  # cut) beside two configurations no H100 run has: 70b8l_dq at 5.5 req/s (the simulator puts the H100's JCT there
  # where the H200's is at 6.5-7; the first H100 session's 8b_mem ran more loaded than simulated) and 8b_light at 2 req/s
  # (40 requests)
  smoke_or_stop
  rec h100g_8b_small M8 50 256 2048 32 256 16 16 150 80 1 "baseline kvquant hack" 5
  rec h100g_70b8l_dq M70 25 2048 4096 128 320 24 16 160 150 1 "baseline kvquant hack" 5.5
  rec h100g_8b_light M8 40 1024 3072 192 448 32 16 140 40 1 "baseline kvquant hack" 2
elif [ "$PART" = h100f ]; then
  # issue 28: configurations the H100 sessions have not recorded, so the H200-fitted engine is tried on settings new
  # to this GPU and host (rates: the simulator's H100 mean JCT against the H200's at its recorded rate, FP16)
  smoke_or_stop
  rec h100g_8b_sat M8 40 1024 3072 32 160 32 16 150 150 1 "baseline kvquant hack" 8
  rec h100g_70b8l_2.5gbps M70 2.5 512 1024 32 128 16 8 130 150 1 "baseline kvquant hack" 9
  rec h100g_8b_kvsat M8 50 2048 6144 192 448 5 16 170 60 1 "baseline kvquant hack" 2
elif [ "$PART" = h100new ]; then
  # issue 28: two configurations no H100 run has, beside one most H100 sessions have (8b_small, the session's host
  # factor): prefill batches of up to 4 requests (8b_pbatch) and the 8-layer 70B at 40 Gbps (70b8l_40gbps), at the
  # rates where the simulator puts the H100's mean JCT near the H200 recordings' (FP16 1.23 s at 10 req/s; HACK 1.26 s
  # at 20 req/s); the calibration fitted on index_h100 predicts them (~360 s)
  smoke_or_stop
  rec h100g_8b_small M8 50 256 2048 32 256 16 16 150 80 1 "baseline kvquant hack" 5
  PFB=4 rec h100g_8b_pbatch M8 25 256 1024 32 160 16 8 190 150 1 "baseline kvquant hack" 10
  rec h100g_70b8l_40gbps M70 40 512 1024 32 128 16 8 150 200 1 "baseline kvquant hack" 20
elif [ "$PART" = h100long ]; then
  # issue 28: long prompts (6-16K tokens) on the H100, never recorded there, beside 8b_small (the session's host factor);
  # rates set from the simulator before any run (FP16 8b_long 3.49 s at 0.8 req/s against the H200's 3.29 s at 1;
  # 70b8l_long 2.16 s at 1.2 against 1.92 s at 1.5)
  smoke_or_stop
  rec h100g_8b_small M8 50 256 2048 32 256 16 16 150 80 1 "baseline kvquant hack" 5
  [ "${REALRUN_SMOKE:-0}" = 1 ] || REC_EXTRA=(--step-times)
  if [ "${H100LONG:-8b}" = 70b ]; then
    rec h100g_70b8l_long M70 25 6144 12288 64 256 24 16 330 60 1 "baseline kvquant hack" 1.2
  else
    MAXB=16 rec h100g_8b_long M8 40 8192 16384 64 256 32 16 330 40 1 "baseline kvquant hack" 0.8
  fi
elif [ "$PART" = pin ]; then
  # issue 28: the run-to-run spread of the host steps with the threads pinned and not
  smoke_or_stop
  for m in hack kvquant; do
    rec h100g_8b_sat M8 40 1024 3072 32 160 32 16 140 150 3 "$m" 8
    REC_EXTRA=(--pin-threads)
    rec h100g_8b_satpin M8 40 1024 3072 32 160 32 16 140 150 3 "$m" 8
    REC_EXTRA=()
  done
elif [ "$PART" = midlink ] || [ "$PART" = midlink100 ]; then
  # issue 28: what validate --cv says only one or two configurations show the fit: the busy link's growth with the line
  # rate (only 8b_sat at 40 Gbps and 8b_mem at 50 put a fast link under the host terms) and the 32-layer prefill's host
  # floor (only 8b_2.5gbps has host-bound 32-layer prefills); rates set from the simulator before any run (midlink100:
  # the same two on an H100, 8B at 25 Gbps at 7 req/s where the H200's runs at 8)
  smoke_or_stop
  if [ "$PART" = midlink ]; then G=h200g; R25=8; else G=h100g; R25=7; fi
  rec ${G}_8b_sat25 M8 25 1024 3072 32 160 32 16 170 150 1 "baseline kvquant hack" $R25
  rec ${G}_8b_short10 M8 10 128 384 32 128 16 8 120 150 1 "baseline kvquant hack" 12
elif [ "$PART" = long70 ]; then
  # issue 28: long prompts on the other model shape (8 layers of the 70B), never measured
  smoke_or_stop
  [ "${REALRUN_SMOKE:-0}" = 1 ] || REC_EXTRA=(--step-times)
  rec h200g_70b8l_long M70 25 6144 12288 64 256 24 16 420 60 1 "baseline kvquant hack" 1.5
elif [ "$PART" = prefill ]; then
  # issue 28: the prefill alone by prompt length, back to back and rested, with the GPU's clocks logged (smi.csv)
  if [ "${REALRUN_SMOKE:-0}" = 1 ]; then PF=(--smoke); else PF=(); fi
  clock_log "$OUT/smi_prefill.csv"
  step 300 prefillcal python3 -m realrun.prefillcal --out "$OUT/prefillcal.csv" "${PF[@]}"
  kill "$SMI" 2>/dev/null
elif [ "$PART" = place ]; then
  if [ "${REALRUN_SMOKE:-0}" = 1 ]; then PC=(--smoke); else PC=(); fi
  step 300 placecal python3 -m realrun.placecal --out "$OUT/placecal.csv" "${PC[@]}"
elif [ "$PART" = kvsat ]; then
  smoke_or_stop
  rec h200g_8b_kvsat M8 50 2048 6144 192 448 5 16 260 60 3 "baseline hack" 2.5
  rec h200g_8b_kvsat M8 50 2048 6144 192 448 5 16 80 60 1 "kvquant" 2.5
elif [ "$PART" = 8b ]; then
  step 150 check python3 -m realrun.check "${CHK8[@]}" "${DEV[@]}"
  step 90 check-70b-shape python3 -m realrun.check "${CHK70[@]}" "${DEV[@]}"
  step 60 smoke python3 -m realrun --method baseline kvquant hack "${SMOKE[@]}" --link-gbps 10 --rate 4 \
    --requests 3 --seed 5 --kv-capacity-gib 4 --time-limit-s 30 --max-decode-batch 8 --out "$WORK/smoke" "${DEV[@]}"
  if [ "$LAST_RC" != 0 ] || [ "$(find "$WORK/smoke" -name requests.csv | wc -l)" != 3 ]; then
    echo "== smoke failed: stopping" | tee -a "$LOG"; kill $PACKER; pack; exit 1
  fi
  if [ "${REALRUN_SMOKE:-0}" = 1 ]; then IMPL=(--smoke --reps 10); else IMPL=(); fi
  step 80 impl_bench python3 -m kernels_calibration.impl_bench --out "$OUT/implementations.json" "${IMPL[@]}"
  config h200g_8b_mem M8 50 1024 3072 192 448 8 16 200 7.5 8.5
  config h200g_8b_sat M8 40 1024 3072 32 160 32 16 150 9 11
elif [ "$PART" = 70b-traces ]; then   # part 70b's configurations alone, after a fail-fast smoke run
  step 60 smoke python3 -m realrun --method baseline kvquant hack "${SMOKE[@]}" --link-gbps 10 --rate 4 \
    --requests 3 --seed 5 --kv-capacity-gib 4 --time-limit-s 30 --max-decode-batch 8 --out "$WORK/smoke" "${DEV[@]}"
  if [ "$LAST_RC" != 0 ] || [ "$(find "$WORK/smoke" -name requests.csv | wc -l)" != 3 ]; then
    echo "== smoke failed: stopping" | tee -a "$LOG"; kill $PACKER; pack; exit 1
  fi
  config h200g_70b8l_dq M70 25 2048 4096 128 320 24 16 170 7.3 8.8
  config h200g_70b8l_1gbps M70 1 128 640 32 128 16 8 110 8
  config h200g_70b8l_2.5gbps M70 2.5 512 1024 32 128 16 8 100 10
  config h200g_8b_2.5gbps M8 2.5 128 384 32 128 16 8 110 7.5
else
  step 100 check-70b-shape python3 -m realrun.check "${CHK70[@]}" "${DEV[@]}"
  if [ "${REALRUN_SMOKE:-0}" = 1 ]; then IMPL=(--smoke --reps 10); else IMPL=(); fi
  step 70 impl_bench python3 -m kernels_calibration.impl_bench --out "$OUT/implementations.json" "${IMPL[@]}"
  if [ "${REALRUN_SMOKE:-0}" = 1 ]; then HC=(--smoke --requests 4); else HC=(--sets "llama-3.1-8b:2;llama-3.1-70b:2"); fi
  step 70 hostcal python3 -m realrun.hostcal --decode-mode graphs --out "$OUT/hostcal_graphs.csv" "${HC[@]}"
  config h200g_70b8l_dq M70 25 2048 4096 128 320 24 16 170 7.3 8.8
  config h200g_70b8l_1gbps M70 1 128 640 32 128 16 8 110 8
  config h200g_70b8l_2.5gbps M70 2.5 512 1024 32 128 16 8 100 10
  # issue 22 dry run: the separate placement's two processes on this one GPU (not a separate-placement trace)
  step 60 separate-dry-run python3 -m realrun --placement separate --devices cuda:0 cuda:0 --method baseline hack \
    "${SMOKE[@]}" --link-gbps 10 --rate 6 --requests 12 --seed 5 --kv-capacity-gib 4 --time-limit-s 40 \
    --max-decode-batch 8 --out "$T/separate_dry_run" "${DEV[@]}"
  step 60 separate-dry-run-stream python3 -m realrun --placement separate --devices cuda:0 cuda:0 --method kvquant \
    "${SMOKE[@]}" --link-gbps 10 --rate 6 --requests 12 --seed 5 --kv-capacity-gib 4 --time-limit-s 40 \
    --max-decode-batch 8 --stream-layers --out "$T/separate_dry_run/stream_kvquant" "${DEV[@]}"
  config h200g_8b_2.5gbps M8 2.5 128 384 32 128 16 8 110 7.5
fi
echo "== done $(date -u +%T), $SECONDS s" | tee -a "$LOG"
kill $PACKER 2>/dev/null
pack
