"""Passes over the graph IR (graph/) and the kernel IR (kernel/), and the pass manager."""
