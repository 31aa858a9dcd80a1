"""Code generators and compiler drivers: kernel IR to CUDA C or C, and binaries."""
