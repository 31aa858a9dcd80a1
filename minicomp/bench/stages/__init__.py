"""The staged GPU run: what a short lease on a GPU machine must yield, in four stages that each
fit one command of the device machine (under 9 minutes on an H100; under 25 together).

  check    device facts, the CUDA test suite on the `cuda` target, compute-sanitizer over one
           small run of every template kind
  kernels  matmul, attention and convolution against cuBLAS, SDPA and cuDNN (and Inductor for
           a chosen few) at search spaces 0 and 1, with the SASS check of every kernel
  models   the model suite at batch 1 and a serving batch in float16, against eager and
           Inductor (default and reduce-overhead), with compile times
  train    one training step (forward, backward, optimizer) of two models against eager and
           Inductor

    bash benchmarks/gpu_run.sh STAGE [--rehearse] [--budget SECONDS] [--out DIR]

Every stage writes at most MAX_FILES files, named `<stage>-<device>-<date>-<commit>.*`: its rows
as JSON Lines (appended as each is measured, so a timeout loses nothing finished), its log,
and what it alone makes (the tests' report, the SASS summary, a chart), plus a cache bundle of
its tuning records and cubins that the next stage imports (stage.py). With `--rehearse` a
stage runs end to end on the CPU: the `cuda-emu` target, tiny shapes, and stand-ins for what
needs a GPU (the timer, compute-sanitizer, nvidia-smi), so CI exercises the procedure, its
files and its JSON on every commit.
"""

STAGES = ("check", "kernels", "models", "train")
