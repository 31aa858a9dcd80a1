"""The performance lens: what decides a generated CUDA kernel's speed, read without a GPU:
counters from the emulator, the compiler's resource usage and SASS, occupancy, and a roofline
estimate on a named device."""
