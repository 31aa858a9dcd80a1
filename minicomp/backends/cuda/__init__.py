"""The CUDA backend (arrives with the CUDA target)."""
