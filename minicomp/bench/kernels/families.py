"""The kernel benchmark families, by name: each module has `gpu_cases()` for a GPU and
`rehearsal_cases(device)` for the CPU rehearsal."""

from minicomp.bench.kernels import attention, conv, matmul, memory

FAMILIES = {"matmul": matmul, "attention": attention, "conv": conv, "memory": memory}
