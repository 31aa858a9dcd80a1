"""alias_views' strides from affine index maps agree with the exhaustive numpy probe."""

import random

import pytest

from minicomp.ir import types as T
from minicomp.ir.compute import compute, tensor_input
from minicomp.passes.graph.alias_views import _affine_strides, _fit_strides, _probe_strides


def _source(rng: random.Random, shape: tuple):
    """An input of `shape` with random strides: a permuted dense layout with padded rows."""
    order = list(range(len(shape)))
    rng.shuffle(order)
    strides = [0] * len(shape)
    step = 1
    for k in reversed(order):
        strides[k] = step
        step *= shape[k] + rng.choice([0, 0, 1, 3])
    return tensor_input("x", shape, T.f32), tuple(strides)


def _views(rng: random.Random):
    """(label, source, its strides, view definition) for many random affine views."""
    a, b, c = rng.randint(2, 5), rng.randint(2, 6), rng.randint(2, 7)
    x, s = _source(rng, (a, b, c))
    yield "permute", x, s, compute("v", (c, a, b), lambda i, j, k: x[j, k, i])
    start, step = rng.randint(0, 1), rng.randint(1, 2)
    n = (c - start + step - 1) // step
    yield "slice", x, s, compute("v", (a, b, n), lambda i, j, k: x[i, j, k * step + start])
    yield "expand", x, s, compute("v", (a, 4, b, c), lambda i, e, j, k: x[i, j, k])
    yield "unsqueeze", x, s, compute("v", (a, 1, b, c), lambda i, u, j, k: x[i, j, k])
    sel = rng.randint(0, b - 1)
    yield "select", x, s, compute("v", (a, c), lambda i, k: x[i, sel, k])
    yield "flip", x, s, compute("v", (a, b, c), lambda i, j, k: x[a - 1 - i, j, k])
    yield "diagonal", x, s, compute("v", (min(a, b), c), lambda i, k: x[i, i, k])
    y, t = _source(rng, (1, b, c))
    yield "broadcast", y, t, compute("v", (a, b, c), lambda i, j, k: y[0, j, k])
    yield "scaled", x, s, compute("v", (a, (b + 1) // 2), lambda i, j: x[i, j * 2, 0])


@pytest.mark.parametrize("seed", range(12))
def test_affine_strides_match_the_probe(seed):
    rng = random.Random(seed)
    for label, _x, strides, view in _views(rng):
        probed = _probe_strides(view, strides)
        derived = _affine_strides(view, strides)
        assert derived is not None, label
        assert derived == probed, label
        assert _fit_strides(view, strides) == probed, label


@pytest.mark.parametrize("seed", range(6))
def test_reshapes_fall_back_to_the_probe(seed):
    rng = random.Random(seed)
    a, b = rng.randint(2, 6), rng.randint(2, 6)
    x, strides = _source(rng, (a, b))
    # A flatten is strided only when the source is dense row-major; the probe decides.
    flat = compute("v", (a * b,), lambda f: x[f // b, f % b])
    split = compute("v", (a, b), lambda i, j: x[(i * b + j) // b, (i * b + j) % b])
    for view in (flat, split):
        assert _affine_strides(view, strides) is None
        assert _fit_strides(view, strides) == _probe_strides(view, strides)
    if strides == (b, 1):
        assert _fit_strides(flat, strides) == ((1,), 0)


def test_out_of_bounds_reads_are_left_to_the_probe():
    x = tensor_input("x", (4, 5), T.f32)
    past = compute("v", (4, 5), lambda i, j: x[i, j + 1])
    assert _affine_strides(past, (5, 1)) is None


def test_views_too_large_to_probe_are_derived():
    """GPT-2's tied LM head reads the (50257, 768) embedding transposed: 38M elements, past
    what the probe evaluates, and still a zero-copy view (a copy cost 150 MB a call)."""
    from minicomp.passes.graph.alias_views import MAX_CHECKED_ELEMENTS

    rows, cols = 50257, 768
    assert rows * cols > MAX_CHECKED_ELEMENTS
    w = tensor_input("w", (rows, cols), T.f32)
    transposed = compute("v", (cols, rows), lambda i, j: w[j, i])
    assert _fit_strides(transposed, (cols, 1)) == ((1, cols), 0)
    flat = compute("v", (rows * cols,), lambda f: w[f // cols, f % cols])
    assert _fit_strides(flat, (cols, 1)) is None  # not affine: the probe would be needed
