"""Kernel IR passes and the index-expression simplifier, one per module."""
