#!/usr/bin/env bash
# The staged GPU validation, one stage per command of a GPU machine (minicomp/bench/stages):
#   bash benchmarks/gpu_run.sh check|kernels|models|train [--budget S] [--out DIR] [...]
#   bash benchmarks/gpu_run.sh all --rehearse     # every stage on the CPU, as CI does
#   bash benchmarks/gpu_run.sh report             # remake benchmarks/results/README.md
# Files go to $OUT (the device tool's folder) or .gpu-run/out, at most 6 a stage. Cache bundles
# put in .gpu-run/carry/ are imported first. Where the copied tree has no .git, name the commit:
#   MINICOMP_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/gpu_run.sh check
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ $# -ge 1 ] || { echo "usage: bash benchmarks/gpu_run.sh STAGE [--rehearse] [options]" >&2; exit 2; }
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
rehearse=0
for arg in "$@"; do [ "$arg" = --rehearse ] && rehearse=1; done

# This checkout must be what `import minicomp` finds, with its torch_dynamo_backends entry point
# registered. Where no minicomp is installed (the GPU image, which has every dependency but no
# network), install this one without fetching anything; an installed one (another checkout)
# is left alone, and PYTHONPATH puts this checkout first. Looked up, not imported: importing
# minicomp imports torch, seconds at every stage's start.
found='import importlib.util as u; raise SystemExit(u.find_spec("minicomp") is None)'
if ! $PY -c "$found" 2>/dev/null; then
    $PY -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 \
        || echo "warning: could not install this checkout; the backend is registered at run time" >&2
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

# Test-only packages the GPU image lacks (expecttest, for the OpInfo sweep) travel as wheels
# in .gpu-run/wheels/ (carried with the tree): `pip download -d .gpu-run/wheels expecttest`.
if [ "$rehearse" = 0 ] && compgen -G ".gpu-run/wheels/*.whl" >/dev/null; then
    $PY -m pip install -q --no-deps --no-index .gpu-run/wheels/*.whl \
        || echo "warning: could not install the wheels in .gpu-run/wheels" >&2
fi

if [ "$rehearse" = 1 ] || [ "$1" = all ] || [ "$1" = report ]; then
    exec $PY -m minicomp.bench.stages "$@"
fi
# A stage keeps to its own budget; this outer limit keeps a hang under the device tool's
# 10 minutes a command, so what the stage wrote still comes back.
exec timeout --kill-after=10 570 $PY -m minicomp.bench.stages "$@"
