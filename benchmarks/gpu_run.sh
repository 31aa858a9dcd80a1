#!/usr/bin/env bash
# Every GPU check in one call (device time is scarce): the CUDA test suite, then the benchmark.
# Logs and the JSON go to $OUT (the device tool's folder) or benchmarks/results/gpu-run.
#   bash benchmarks/gpu_run.sh [tests|bench|matmul|attention|conv|models|all]
# `models` is the model suite (minicomp bench) at batch 1 in float16: set MODELS, BACKENDS to
# narrow it; a session's device time does not fit the whole suite with every backend.
set -uo pipefail
what=${1:-all}
out=${OUT:-benchmarks/results/gpu-run}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 MINICOMP_CACHE_DIR=${MINICOMP_CACHE_DIR:-/tmp/minicomp-cache}
# The image has every dependency but no network: register the package (and its
# torch_dynamo_backends entry point) without fetching anything.
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$out/install.txt" 2>&1 \
    || export PYTHONPATH=$PWD
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; git rev-parse HEAD; date -u; } \
    >"$out/device.txt" 2>&1
python3 -c "from minicomp.backends.cuda import nvrtc; print('nvrtc', nvrtc.nvrtc_version())" \
    >>"$out/device.txt" 2>&1
cat "$out/device.txt"
if [ "$what" != bench ] && [ "$what" != models ]; then
    MINICOMP_TEST_TARGETS=cuda timeout 400 python3 -m pytest -q -n 8 -p no:cacheprovider tests \
        2>&1 | tee "$out/cuda-tests.txt" | tail -40
fi
if [ "$what" = all ] || [ "$what" = matmul ]; then
    timeout 300 python3 benchmarks/matmul.py --tune-budget 10 --out "$out/matmul.json" \
        2>&1 | tee "$out/matmul.txt"
fi
if [ "$what" = all ] || [ "$what" = attention ]; then
    timeout 300 python3 benchmarks/attention.py --tune-budget 10 --out "$out/attention.json" \
        2>&1 | tee "$out/attention.txt"
fi
if [ "$what" = all ] || [ "$what" = conv ]; then
    timeout 300 python3 benchmarks/conv.py --dtypes f16 --tune-budget 10 --out "$out/conv.json" \
        2>&1 | tee "$out/conv.txt"
fi
if [ "$what" = all ] || [ "$what" = bench ]; then
    timeout 300 python3 benchmarks/cuda_bench.py --repeat 30 --out "$out/cuda-bench.json" \
        2>&1 | tee "$out/cuda-bench.txt"
fi
if [ "$what" = models ]; then
    MINICOMP_TUNE_BUDGET=${MINICOMP_TUNE_BUDGET:-10} timeout 580 python3 -m minicomp bench \
        --device cuda --dtypes float16 --batch 1 ${MODELS:+--models "$MODELS"} \
        --backends "${BACKENDS:-eager,inductor,inductor-max-autotune,minicomp-ss0,minicomp-ss2}" \
        --json "$out/models.json" --chart "$out/models.png" 2>&1 | tee "$out/models.txt"
fi
