"""Compare a compiled run with eager: count, dtypes, shapes and strides of the outputs, their
values (within a dtype's tolerance for floats, exactly otherwise, NaN where eager has NaN),
the inputs after the call (mutations) and the gradients."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false

from minicomp.fuzz.run import Result

# (rtol, atol) by dtype; a fused kernel may round and reassociate differently from eager.
TOLERANCES = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (5e-2, 5e-2),
}
# A compiled result off eager by more than the tolerance still passes when its error from a
# float64 run is at most this many times eager's own (eager rounds every op to the dtype).
REFERENCE_FACTOR = 2.0


@dataclass(frozen=True)
class Mismatch:
    """How a compiled run differs from eager.

    section: output, input (contents after the call) or grad; kind: count, dtype, shape,
    stride or values; where: which tensor; message: the details.
    """

    section: str
    kind: str
    where: str
    message: str


def _significant_strides(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(stride for stride, size in zip(t.stride(), t.shape) if size > 1)


def _close_to_reference(
    actual: torch.Tensor, expected: torch.Tensor, reference: torch.Tensor, rtol: float, atol: float
) -> bool:
    """Whether every element of actual is close to eager's, or as close to the float64 run's
    as eager's largest error allows (an infinity or NaN where float64 has one counts too)."""
    if reference.shape != expected.shape:
        return False
    a, e, r = (t.detach().to(torch.float64) for t in (actual, expected, reference))
    near_eager = torch.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    both_finite = torch.isfinite(e) & torch.isfinite(r)
    eager_error = (e - r)[both_finite].abs().max() if both_finite.any() else 0.0
    scale = torch.where(torch.isfinite(r), r.abs(), 0.0)
    allowed = REFERENCE_FACTOR * eager_error + atol + rtol * scale
    near_reference = ((a - r).abs() <= allowed) | (a == r) | (a.isnan() & r.isnan())
    return bool((near_eager | near_reference).all())


def tolerance(dtypes: set[torch.dtype]) -> tuple[float, float]:
    """(rtol, atol) for values computed through `dtypes`: the loosest of their tolerances (a
    float32 sum cast to float64 is only as exact as float32)."""
    floats = [TOLERANCES[d] for d in dtypes if d in TOLERANCES] or [TOLERANCES[torch.float64]]
    return max(rtol for rtol, _ in floats), max(atol for _, atol in floats)


def _value_difference(
    actual: torch.Tensor,
    expected: torch.Tensor,
    reference: torch.Tensor | None,
    precision: set[torch.dtype],
) -> str | None:
    if expected.is_floating_point():
        rtol, atol = tolerance(precision | {expected.dtype})
        try:
            torch.testing.assert_close(
                actual, expected, rtol=rtol, atol=atol, equal_nan=True, check_stride=False
            )
            return None
        except AssertionError as e:
            if reference is not None and _close_to_reference(
                actual, expected, reference, rtol, atol
            ):
                return None
            return str(e).strip()
    if torch.equal(actual, expected):
        return None
    differ = (actual != expected).nonzero()
    first = tuple(differ[0].tolist())
    return (
        f"{len(differ)} of {expected.numel()} elements differ; at {first}: "
        f"{actual[first].item()!r} (compiled) != {expected[first].item()!r} (eager)"
    )


def compare_tensor(
    actual: torch.Tensor,
    expected: torch.Tensor,
    reference: torch.Tensor | None = None,
    *,
    check_stride: bool = True,
    precision: set[torch.dtype] = frozenset(),
) -> tuple[str, str] | None:
    """(kind, message) of the first way actual differs from expected, or None."""
    if actual.dtype != expected.dtype:
        return "dtype", f"dtype {actual.dtype} (compiled) != {expected.dtype} (eager)"
    if actual.shape != expected.shape:
        return "shape", f"shape {tuple(actual.shape)} (compiled) != {tuple(expected.shape)} (eager)"
    if (
        check_stride
        and expected.numel() > 0
        and is_non_overlapping_and_dense_or_false(expected)
        and _significant_strides(actual) != _significant_strides(expected)
    ):
        return "stride", f"strides {actual.stride()} (compiled) != {expected.stride()} (eager)"
    message = _value_difference(actual, expected, reference, set(precision))
    return None if message is None else ("values", message)


def _pick(result: Result | None, section: str, k: int) -> torch.Tensor | None:
    if result is None:
        return None
    items = {"output": result.outputs, "input": result.inputs, "grad": result.grads or ()}
    items = items[section]
    return items[k] if k < len(items) else None


def compare_results(
    actual: Result,
    expected: Result,
    reference: Result | None = None,
    names: tuple = (),
    precision: set[torch.dtype] = frozenset(),
) -> Mismatch | None:
    """The first difference of a compiled run from eager, or None.

    `reference` (a float64 run) lets a float result pass that is as close to float64 as eager
    is; `names` are the inputs' names, for the messages; `precision` the float dtypes the
    program computes in, which set the tolerance with the result's own.
    """
    if len(actual.outputs) != len(expected.outputs):
        counts = f"{len(actual.outputs)} (compiled) != {len(expected.outputs)} (eager)"
        return Mismatch("output", "count", "outputs", f"number of outputs {counts}")
    sections = [("output", actual.outputs, expected.outputs, True)]
    sections.append(("input", actual.inputs, expected.inputs, False))
    if expected.grads is not None or actual.grads is not None:
        sections.append(("grad", actual.grads or (), expected.grads or (), False))
    for section, got, wanted, strides in sections:
        for k, (a, e) in enumerate(zip(got, wanted)):
            where = _where(section, k, names, expected.wrt)
            if a is None or e is None:
                if a is e or not bool(((e if a is None else a) != 0).any()):
                    continue
                sides = (
                    "None (compiled), nonzero (eager)"
                    if a is None
                    else "nonzero (compiled), None (eager)"
                )
                return Mismatch(section, "values", where, f"{where}: {sides}")
            found = compare_tensor(
                a, e, _pick(reference, section, k), check_stride=strides, precision=precision
            )
            if found is not None:
                kind, message = found
                return Mismatch(section, kind, where, f"{where}: {message}")
    return None


def _where(section: str, k: int, names: tuple, wrt: tuple[int, ...]) -> str:
    if section == "grad":
        of = wrt[k] if k < len(wrt) else None
        return f"gradient of {names[of]}" if of is not None and of < len(names) else f"gradient {k}"
    if section == "input":
        return f"input {names[k] if k < len(names) else k} after the call"
    return f"output {k}"
