"""OpInfo sweep: ops from PyTorch's op_db compiled by minicomp and compared with eager."""

import pytest
import torch
import torch._dynamo
from helpers import assert_same, clone_inputs, compile_minicomp
from torch._dynamo.utils import counters
from torch.utils import _pytree as pytree

# PyTorch's OpInfo database imports expecttest, a test-only package some machines lack.
pytest.importorskip("expecttest", reason="PyTorch's OpInfo database needs expecttest")
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

from minicomp.dynamo.backend import recording
from minicomp.explain import Explanation


def _full_name(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


OPS = {_full_name(op): op for op in op_db}

# The default run: a representative subset, one compile per op and target (its samples in one
# graph), so keep it near 120 ops.
SUBSET = [
    # elementwise unary
    *("abs", "neg", "exp", "log", "log1p", "sqrt", "rsqrt", "sin", "cos", "tanh"),
    *("sigmoid", "erf", "reciprocal", "floor", "round", "sign", "square", "logical_not"),
    *("nan_to_num", "clamp", "to"),
    *("nn.functional.relu", "nn.functional.gelu", "nn.functional.silu"),
    *("nn.functional.leaky_relu", "nn.functional.hardtanh", "nn.functional.softplus"),
    # elementwise binary and ternary
    *("add", "sub", "mul", "div.no_rounding_mode", "div.trunc_rounding", "pow", "maximum"),
    *("minimum", "remainder", "atan2", "logical_and", "xlogy"),
    *("addcmul", "addcdiv", "lerp", "where", "masked_fill"),
    # comparisons
    *("eq", "ne", "lt", "le", "gt", "ge"),
    # reductions
    *("sum", "mean", "amax", "amin", "prod", "var", "std", "argmax", "argmin", "any", "all"),
    *("logsumexp", "max.reduction_with_dim", "linalg.vector_norm", "cumsum"),
    # softmax and normalization
    *("softmax", "log_softmax", "nn.functional.layer_norm"),
    *("nn.functional.group_norm", "nn.functional.batch_norm", "nn.functional.rms_norm"),
    # views, shapes, indexing and factories
    *("view", "reshape", "permute", "expand", "squeeze", "unsqueeze", "narrow", "select"),
    *("cat", "stack", "index_select", "gather", "nn.functional.embedding", "constant_pad_nd"),
    *("nn.functional.pad.constant", "nn.functional.pad.reflect", "arange", "full"),
    *("transpose", "flatten", "flip", "roll", "chunk", "repeat", "tril"),
    *("slice", "scatter_add", "index_put", "diagonal"),
    # matmul, conv, attention, pooling, resize, losses
    *("matmul", "mm", "bmm", "addmm", "mv", "nn.functional.linear", "einsum"),
    *("nn.functional.scaled_dot_product_attention", "nn.functional.conv2d"),
    *("nn.functional.conv1d", "nn.functional.conv_transpose2d", "nn.functional.max_pool2d"),
    *("nn.functional.avg_pool2d", "nn.functional.adaptive_avg_pool2d"),
    *("nn.functional.interpolate.bilinear", "nn.functional.cross_entropy"),
    *("nn.functional.mse_loss",),
    # exotic: expected to run as extern ATen calls, and must do so cleanly
    *("sort", "topk", "kthvalue", "searchsorted", "logcumsumexp", "linalg.det", "linalg.inv"),
    *("fft.rfft", "nn.functional.grid_sample", "histc", "nn.functional.unfold"),
]

SUBSET_SAMPLES = 2  # per op in the default run: every sample adds to the graph compiled
FULL_SAMPLES = 3

# Outputs that are random or uninitialized cannot be compared with eager.
RANDOM_OPS = {
    "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial", "normal",
    "normal.in_place", "normal.number_mean", "rand_like", "randint", "randint_like", "randn",
    "randn_like", "uniform", "nn.functional.dropout", "nn.functional.dropout2d",
    "nn.functional.dropout3d", "nn.functional.alpha_dropout", "nn.functional.rrelu",
    "nn.functional.feature_alpha_dropout.with_train", "nn.functional.fractional_max_pool2d",
    "nn.functional.fractional_max_pool3d", "svd_lowrank", "pca_lowrank",
}  # fmt: skip
UNINITIALIZED_OPS = {
    "empty", "empty_like", "empty_permuted", "empty_strided", "new_empty", "new_empty_strided",
    "resize_", "resize_as_",
}  # fmt: skip

FLOAT32_DEFAULT = {"rtol": 1.3e-6, "atol": 1e-5}  # torch.testing.assert_close's float32 default
_ACCUMULATION_ORDER = {"rtol": 1e-5, "atol": 1e-5}
# Loosened only where minicomp legitimately computes in another order than ATen:
TOLERANCES = {
    # tiled kernels sum the K dimension in another order than MKL/oneDNN
    **dict.fromkeys(
        ("matmul", "mm", "bmm", "addmm", "mv", "nn.functional.linear", "einsum"),
        _ACCUMULATION_ORDER,
    ),
    **dict.fromkeys(
        ("nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv_transpose2d"),
        _ACCUMULATION_ORDER,
    ),
    "nn.functional.scaled_dot_product_attention": _ACCUMULATION_ORDER,
    # mean and variance in one pass (Welford) or two, in another order than ATen
    **dict.fromkeys(
        ("var", "std", "nn.functional.layer_norm"),
        _ACCUMULATION_ORDER,
    ),
    **dict.fromkeys(
        ("nn.functional.group_norm", "nn.functional.batch_norm", "nn.functional.rms_norm"),
        _ACCUMULATION_ORDER,
    ),
}


# PyTorch's fake (meta) strides of these ops differ from its eager kernel's in some versions
# (Inductor asserts on them there too); compiled code follows the traced strides, so only the
# values are compared.
_TORCH = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
META_STRIDES_DIFFER = {"fft.rfft"} if _TORCH < (2, 12) else set()


# OpInfo wraps these in wrapper_set_seed, whose manual_seed call dynamo cannot trace; call
# the function itself (samples that use dropout are then dropped as random).
DIRECT_CALLS = {
    "nn.functional.scaled_dot_product_attention": torch.nn.functional.scaled_dot_product_attention,
}


def _as_function(call, sample):
    """`f(*tensors)` calling the op on the sample, with every non-tensor argument closed over.

    `f` is written out as Python source (`f(*t): return call(t[0], [t[1], t[2]], dim=c[0])`)
    so that Dynamo traces a call, not a pytree rebuild of its arguments: that rebuild cost
    more to trace than many ops cost to compile. Anything but a plain tuple, list or
    string-keyed dict holding a tensor is rebuilt with pytree instead."""
    tensors, consts = [], []

    def spelled(x) -> str:
        if isinstance(x, torch.Tensor):
            tensors.append(x)
            return f"t[{len(tensors) - 1}]"
        if type(x) in (list, tuple):
            inner = "".join(f"{spelled(v)}, " for v in x)
            return f"[{inner}]" if type(x) is list else f"({inner})"
        if type(x) is dict and all(isinstance(k, str) for k in x):
            return "{" + "".join(f"{k!r}: {spelled(v)}, " for k, v in x.items()) + "}"
        if any(isinstance(leaf, torch.Tensor) for leaf in pytree.tree_leaves(x)):
            raise TypeError(f"a tensor inside {type(x).__name__}")
        consts.append(x)
        return f"c[{len(consts) - 1}]"

    try:
        first = spelled(sample.input)
        args = "".join(f", {spelled(a)}" for a in sample.args)
        kwargs = f", **{spelled(dict(sample.kwargs))}"
    except TypeError:
        return _as_function_by_pytree(call, sample)
    namespace = {"call": call, "c": consts}
    exec(f"def f(*t):\n    return call({first}{args}{kwargs})\n", namespace)  # noqa: S102
    return namespace["f"], tensors


def _as_function_by_pytree(call, sample):
    """`_as_function` for arguments it cannot write out."""
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    tensors = [leaves[i] for i in slots]

    def f(*tensors):
        filled = list(leaves)
        for i, tensor in zip(slots, tensors, strict=True):
            filled[i] = tensor
        first, args, kwargs = pytree.tree_unflatten(filled, spec)
        return call(first, *args, **kwargs)

    return f, tensors


def _together(calls: list) -> tuple:
    """One function `g(*tensors)` returning the tuple of every `(f, tensors)` call's result, and
    the tensors of all of them: the samples compile as one graph (a compile each cost more than
    the ops), each result still compared with its own eager one."""
    spans, tensors = [], []
    for _, ts in calls:
        spans.append(f"fs[{len(spans)}](*t[{len(tensors)}:{len(tensors) + len(ts)}]), ")
        tensors += ts
    namespace = {"fs": [f for f, _ in calls]}
    exec(f"def g(*t):\n    return ({''.join(spans)})\n", namespace)  # noqa: S102
    return namespace["g"], tensors


def _same(a, b) -> bool:
    try:
        assert_same(a, b, rtol=0, atol=0, equal_nan=True)
    except AssertionError:
        return False
    return True


def _eager_cases(name: str, limit: int):
    """Up to `limit` (f, tensors, expected) cases that eager runs, and runs the same twice."""
    op, cases, random_samples = OPS[name], [], 0
    for sample in op.sample_inputs("cpu", torch.float32, requires_grad=False):
        f, tensors = _as_function(DIRECT_CALLS.get(name, op.op), sample)
        try:
            expected = f(*clone_inputs(tensors))
            again = f(*clone_inputs(tensors))
        except Exception:  # noqa: BLE001, S112  (eager rejects it: nothing to compare with)
            continue
        if not _same(expected, again):
            random_samples += 1
            continue
        cases.append((f, tensors, expected))
        if len(cases) == limit:
            break
    if not cases and random_samples:
        pytest.skip("two eager runs differ on every sample: the op is random")
    return cases


def _status(records: list) -> tuple[str, list[str]]:
    """What the first sample's compilation did: native, or the ops left to ATen (zero-copy
    views of minicomp's own results are not: they move no data)."""
    views = {
        n.name
        for r in records
        for n in (r.graph.nodes if r.graph is not None else ())
        if getattr(getattr(n, "target", None), "is_view", False)
    }
    fallbacks = sorted(set(Explanation(records).fallbacks) - views)
    return ("fallback" if fallbacks else "native"), fallbacks


def _check_op(name: str, target: str, record_property, limit: int) -> None:
    record_property("opinfo_op", name)
    record_property("opinfo_target", target)
    op = OPS[name]
    if name in RANDOM_OPS:
        pytest.skip("random op: outputs cannot match eager")
    if name in UNINITIALIZED_OPS:
        pytest.skip("output memory is uninitialized")
    if torch.float32 not in op.supported_dtypes("cpu"):
        pytest.skip("op has no float32 CPU kernel")
    cases = _eager_cases(name, limit)
    if not cases:
        pytest.skip("eager runs none of the float32 samples")
    tolerance = TOLERANCES.get(name, FLOAT32_DEFAULT)
    f, tensors = _together([(f, tensors) for f, tensors, _ in cases])
    counters.clear()
    records: list = []
    with recording(records):
        actual = compile_minicomp(f, target)(*clone_inputs(tensors))
    # A sample Dynamo cannot capture runs eagerly beside the others' graph: a frame not ok.
    frames = counters["frames"]
    captured = counters["stats"]["unique_graphs"] > 0 and not counters["graph_break"]
    captured &= frames["ok"] == frames["total"]
    strides = name not in META_STRIDES_DIFFER
    for k, (got, (_, _, expected)) in enumerate(zip(actual, cases, strict=True)):
        try:
            assert_same(got, expected, equal_nan=True, check_stride=strides, **tolerance)
        except AssertionError as err:
            raise AssertionError(f"sample {k}: {err}") from None
    if not captured:
        record_property("opinfo_status", "not captured by dynamo")
        return
    status, fallbacks = _status(records)
    record_property("opinfo_status", status)
    record_property("opinfo_fallbacks", ",".join(fallbacks))


@pytest.mark.parametrize("name", SUBSET)
def test_opinfo(name, target, record_property):
    _check_op(name, target, record_property, SUBSET_SAMPLES)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OPS))
def test_opinfo_full(name, target, record_property):
    _check_op(name, target, record_property, FULL_SAMPLES)


def test_subset_names_exist():
    missing = [name for name in SUBSET if name not in OPS]
    assert not missing, f"not in op_db: {missing}"
    assert len(set(SUBSET)) == len(SUBSET)
