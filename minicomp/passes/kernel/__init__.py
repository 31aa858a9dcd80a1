"""Kernel IR passes, one per module (the expression simplifier they use is ir/simplify.py)."""
