"""Kernel benchmarks: cases (a function, its inputs and a reference) measured under the
library PyTorch calls, minicomp at each search space and Inductor (cases.py), with fair
timing (timing.py); the families are matmul, attention, conv and memory-bound kernels."""
