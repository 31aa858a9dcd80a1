"""Operator definitions, one module per family; importing this registers every lowering."""

from minicomp.ops import creation, elementwise, index, norm, pool, reduce, shape  # noqa: F401
