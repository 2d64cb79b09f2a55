#!/usr/bin/env bash
# One step of the first GPU session's plan (shared GPU-PREFLIGHT notes, "a sensible first 30 minutes"),
# without make: a GPU machine has no network, so nothing is installed; its own python3 holds torch and
# triton, and attnlib is used from this checkout (PYTHONPATH). Each step stays under 10 minutes and
# writes its files into DIR as it goes, so a step stopped early keeps what it measured.
#
#   tools/gpu_run.sh [--dry-run] STEP DIR
#
# STEP:
#   check    versions, clocks and power (nvidia-smi -q), the Triton and CUDA tests, and the forward and
#            gradients of ragged shapes against float64 SDPA (tools/gpu_check.py)
#   fwd      the fp16 forward sweeps, d = 64 and 128 (presets gpu-fwd-d64, gpu-fwd-d128)
#   fwdbwd   the same for forward + backward, from T = 1024 (presets gpu-fwdbwd-d64, gpu-fwdbwd-d128)
#   extra    bf16 and small-T fp32 (presets gpu-bf16, gpu-fp32), a do_bench cross-check at T = 4096,
#            and an ncu profile of the Triton forward at T = 4096
#   recheck  after a change to the kernels' tiles: versions, the Triton and CUDA tests, the sm_90
#            compile check with the machine's own Triton, and fwd+bwd at d = 128 again
#   decode   issue 34 item 1: attention_with_kvcache on triton (contiguous and paged, split and unsplit)
#            against SDPA with one query, fp16 then bf16 (attnlib.bench.kvcache_decode), GB/s against a
#            measured copy; and the split-KV kernel's tests on the GPU
# --dry-run prints each command and runs the parts that need no GPU (the bench's and the checker's own
# dry runs), so that the plan is tested on a CPU.
set -uo pipefail

DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
if [ $# -ne 2 ]; then
  sed -n '2,/^set /p' "$0" | sed '$d' >&2
  exit 2
fi
STEP=$1
DIR=$2
cd "$(dirname "$0")/.."
mkdir -p "$DIR"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
LOG="$DIR/run.log"

# run SECONDS CMD...: print the command, run it under a time limit (or dry-run it), log both
run() {
  local limit=$1; shift
  echo "+ [limit ${limit}s] $*" | tee -a "$LOG"
  if [ "$DRY" = 1 ]; then return 0; fi
  timeout "$limit" "$@" 2>&1 | tee -a "$LOG"
  local status=${PIPESTATUS[0]}
  [ "$status" = 0 ] || echo "! exit $status: $*" | tee -a "$LOG"
  return 0
}

# bench SECONDS PRESET FILE [more options]: one preset of the benchmark, rows written as they come
bench() {
  local limit=$1 preset=$2 file=$3; shift 3
  if [ "$DRY" = 1 ]; then
    echo "+ [limit ${limit}s] $PY -m attnlib.bench --preset $preset --output $DIR/$file --no-progress $*" | tee -a "$LOG"
    "$PY" -m attnlib.bench --preset "$preset" --dry-run "$@" | tail -n 1 | tee -a "$LOG"
    return "${PIPESTATUS[0]}"
  fi
  run "$limit" "$PY" -m attnlib.bench --preset "$preset" --output "$DIR/$file" --no-progress "$@"
}

case "$STEP" in
  check)
    echo "+ versions, nvidia-smi -q -> $DIR/versions.txt" | tee -a "$LOG"
    if [ "$DRY" = 0 ]; then
      { "$PY" -c 'import sys, torch, triton; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version()); print("triton", triton.__version__); print(torch.cuda.get_device_name(), torch.cuda.get_device_properties(0))'
        nvidia-smi; nvidia-smi -q -d CLOCK,POWER,PERFORMANCE,TEMPERATURE; } > "$DIR/versions.txt" 2>&1
    fi
    run 300 "$PY" -m pytest tests/test_triton.py tests/test_cuda.py -q -x -p no:cacheprovider -n 8 -o addopts=""
    if [ "$DRY" = 1 ]; then "$PY" tools/gpu_check.py "$DIR/ragged.csv" --dry-run | tail -n 1; fi
    run 200 "$PY" tools/gpu_check.py "$DIR/ragged.csv"
    ;;
  fwd)
    bench 280 gpu-fwd-d64 fwd_d64.csv
    bench 300 gpu-fwd-d128 fwd_d128.csv
    ;;
  fwdbwd)
    bench 280 gpu-fwdbwd-d64 fwdbwd_d64.csv
    bench 300 gpu-fwdbwd-d128 fwdbwd_d128.csv
    ;;
  extra)
    bench 200 gpu-bf16 bf16.csv
    bench 100 gpu-fp32 fp32.csv
    bench 120 gpu-fwd-d64 dobench_t4096.csv -T 4096 --timer do_bench --kernels triton,triton-simple,sdpa-flash,sdpa-cudnn
    run 150 bash -c "ncu --target-processes all -k regex:_attn_fwd --launch-skip 20 --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats $PY -c 'import torch, attnlib; q, k, v = (torch.randn(4, 32, 4096, 64, device=\"cuda\", dtype=torch.float16) for _ in range(3)); [attnlib.attention(q, k, v, backend=\"triton\") for _ in range(25)]; torch.cuda.synchronize()' > $DIR/ncu_fwd_d64.txt 2>&1"
    ;;
  recheck)
    echo "+ versions, nvidia-smi -q -> $DIR/versions.txt" | tee -a "$LOG"
    if [ "$DRY" = 0 ]; then
      { "$PY" -c 'import sys, torch, triton; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version()); print("triton", triton.__version__); print(torch.cuda.get_device_name(), torch.cuda.get_device_properties(0))'
        nvidia-smi; nvidia-smi -q -d CLOCK,POWER,PERFORMANCE,TEMPERATURE; } > "$DIR/versions.txt" 2>&1
    fi
    run 200 "$PY" -m pytest tests/test_triton.py tests/test_cuda.py -q -p no:cacheprovider -n 8 -o addopts=""
    bench 170 gpu-fwdbwd-d128 fwdbwd_d128.csv
    run 100 "$PY" -m attnlib.bench.sm90 --required --jobs 16
    ;;
  decode)
    if [ "$DRY" = 1 ]; then "$PY" -m attnlib.bench.kvcache_decode --dry-run --output "$DIR/decode_dry.csv" | tail -n 2; fi
    run 120 "$PY" -m pytest tests/test_kvcache_triton.py -q -x -p no:cacheprovider -n 8 -o addopts=""
    run 280 "$PY" -m attnlib.bench.kvcache_decode --dtypes fp16 --output "$DIR/decode_fp16.csv"
    run 280 "$PY" -m attnlib.bench.kvcache_decode --dtypes bf16 --output "$DIR/decode_bf16.csv"
    ;;
  *)
    echo "unknown step $STEP: check, fwd, fwdbwd, extra, recheck or decode" >&2
    exit 2
    ;;
esac
echo "step $STEP done" | tee -a "$LOG"
