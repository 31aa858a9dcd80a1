"""Every minicomp option: its type, default, environment variable and meaning."""

import contextlib
import dataclasses
import difflib
import os
import textwrap
import threading
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

_TRUE_WORDS = ("1", "true", "yes", "on")
_FALSE_WORDS = ("0", "false", "no", "off")
_NONE_WORDS = ("", "none")


def _option(
    default: Any,
    doc: str,
    *,
    choices: tuple[Any, ...] | None = None,
    minimum: int | None = None,
) -> Any:
    return field(default=default, metadata={"doc": doc, "choices": choices, "minimum": minimum})


@dataclass(frozen=True)
class Options:
    """The resolved value of every option for one compilation."""

    target: str = _option(
        "auto",
        "Where kernels run. auto: cuda when CUDA is available and the inputs are on a CUDA "
        "device, else cpu. cuda-emu runs the generated CUDA C on the host.",
        choices=("auto", "cpu", "cuda", "cuda-emu"),
    )
    search_space: int = _option(
        0,
        "Schedule search. 0: heuristics, no benchmarking; 1: a small space; 2: the full space.",
        choices=(0, 1, 2),
    )
    tune_budget: int | None = _option(
        None,
        "Seconds the tuner may spend on one kernel (compiling and timing candidates) before it "
        "keeps the best one so far. Unset: 30 at search space 1, 300 at search space 2; 0: no "
        "limit.",
        minimum=0,
    )
    tensor_cores: bool = _option(True, "Let CUDA matmul and conv templates use tensor cores.")
    cost_model: str = _option(
        "auto",
        "How search spaces 1 and 2 rank a template's candidates. measure: time them on the GPU; "
        "lens: estimate them with the performance lens (no GPU needed; on lens_device); auto: "
        "measure on the cuda target, lens on cuda-emu.",
        choices=("auto", "measure", "lens"),
    )
    lens_device: str = _option(
        "h100",
        "The GPU the performance lens estimates for (the lens cost model, minicomp profile): "
        "h100, h200 or a100.",
        choices=("h100", "h200", "a100"),
    )
    cuda_graphs: bool = _option(
        True, "Capture each compiled CUDA plan once as a CUDA graph and replay it."
    )
    fallback: str = _option(
        "eager",
        "What to do when minicomp cannot compile part of a graph. eager: run the ops of a kernel "
        "that fails to compile as ATen calls (KernelFallbackWarning), and a graph that fails "
        "otherwise with PyTorch (FallbackWarning); error: raise.",
        choices=("eager", "error"),
    )
    cache_dir: str = _option(
        "~/.cache/minicomp",
        "Root of the on-disk caches (compiled kernels, tuning records); ~ is expanded.",
    )
    graph_cache: bool = _option(
        True,
        "Keep each compiled graph in the cache directory, so that compiling the same graph again "
        "(in this process or a later one) skips minicomp's passes, tuning and scheduling.",
    )
    parallel_compile: int = _option(
        0, "Number of kernels compiled in parallel; 0 means one per CPU core.", minimum=0
    )
    verbose: int = _option(
        0,
        "Logging, a shortcut for TORCH_LOGS. 0: warnings only; 1: one line per graph (ATen ops, "
        "kernels, ATen calls and why), as TORCH_LOGS=minicomp; 2: also every minicomp_* "
        "artifact (the IR after each pass, fused groups, ATen calls, tuning, kernel IR, "
        "source).",
        choices=(0, 1, 2),
    )
    freeze: bool = _option(
        False, "Treat parameters and buffers as constants, so they can be folded (inference only)."
    )
    cpu_gemm: str = _option(
        "auto",
        "Which library computes the cpu target's float32 matrix products. onednn: oneDNN's "
        "linear (its weight prepacked under freeze); mkl: ATen's product (MKL's sgemm; its "
        "weight prepacked by MKL under freeze, as Inductor's freezing does). auto: mkl on Intel "
        "CPUs, where it is as fast or faster, onednn on others (AMD: 0.45 of MKL's time).",
        choices=("auto", "onednn", "mkl"),
    )
    arch: str | None = _option(
        None,
        "CUDA architecture to compile for, such as sm_90, which also decides what the templates "
        "may use (float8 mma: sm_89+; the Hopper matmul, TMA and wgmma: sm_90a). Unset: the "
        "target's device's (cuda: the GPU's own, sm_90 as sm_90a; cuda-emu: lens_device's).",
    )
    sm_count: int | None = _option(
        None,
        "The SMs of the GPU kernels are scheduled for: the heuristics size grids to fill them. "
        "Unset: the target's device's (cuda: the GPU's own; cuda-emu and cpu: lens_device's).",
        minimum=1,
    )
    nvrtc_library: str | None = _option(
        None,
        "The libnvrtc the cuda target compiles with (a CUDA toolkit's, or another wheel's), such "
        "as /usr/local/cuda/lib64/libnvrtc.so; unset: the one cuda-python finds. A process keeps "
        "the first NVRTC it loads; tuning's compile workers use the same one.",
    )
    cc: str = _option("cc", "The C compiler used by the cpu target.")
    cflags: str = _option(
        "-O3 -march=native -fopenmp -fno-math-errno -fPIC -shared",
        "Flags passed to the C compiler for the cpu target. Kernels streaming large tensors "
        "ask GCC for 512-bit vectors on AVX-512 CPUs; -DMC_NARROW_VECTORS keeps its default.",
    )
    debug: bool = _option(
        False, "Build C kernels with -g and keep their source next to the shared library."
    )
    debug_dir: str | None = _option(
        None,
        "A folder where each compiled graph writes what compiling it did, as "
        "TORCH_COMPILE_DEBUG does for Inductor: the ATen graph, the graph IR after each pass, "
        "the fused groups, the ATen calls and why, the kernel IR, the source (.c or .cu) and a "
        "summary, in <debug_dir>/run-<time>-pid<pid>/<n>-<kind>-<compile id>/. Graphs are "
        "compiled in full (never linked from the graph cache) to show every pass; ~ is "
        "expanded.",
    )
    emu_checks: bool = _option(
        False,
        "cuda-emu checks every access of a script kernel to its tensor arguments against their "
        "bounds, and reports an access out of them (kernel, tensor, index, thread) as an error "
        "instead of corrupting the process. Several times slower.",
    )

    lens: bool = _option(
        False,
        "cuda-emu builds each graph's kernels to also count what they ask of a GPU (sectors, "
        "bank conflicts, tensor-core and other instructions) for a sample of each launch's "
        "blocks: the performance lens that `minicomp profile` reports. Slower to build and run.",
    )


@dataclass(frozen=True)
class _Spec:
    name: str
    type: type
    nullable: bool
    default: Any
    doc: str
    choices: tuple[Any, ...] | None
    minimum: int | None

    @property
    def env(self) -> str:
        return "MINICOMP_" + self.name.upper()

    @property
    def type_name(self) -> str:
        return self.type.__name__ + (" | None" if self.nullable else "")


def _build_specs() -> dict[str, _Spec]:
    hints = typing.get_type_hints(Options)
    specs = {}
    for f in dataclasses.fields(Options):
        hint = hints[f.name]
        nullable = isinstance(hint, types.UnionType) and type(None) in hint.__args__
        if nullable:
            (hint,) = [arg for arg in hint.__args__ if arg is not type(None)]
        specs[f.name] = _Spec(
            name=f.name,
            type=hint,
            nullable=nullable,
            default=f.default,
            doc=f.metadata["doc"],
            choices=f.metadata["choices"],
            minimum=f.metadata["minimum"],
        )
    return specs


_SPECS: dict[str, _Spec] = _build_specs()

_lock = threading.Lock()
_overrides: dict[str, Any] = {}


def names() -> tuple[str, ...]:
    """Return the name of every option, in declaration order."""
    return tuple(_SPECS)


def _spec(name: str) -> _Spec:
    spec = _SPECS.get(name)
    if spec is None:
        close = difflib.get_close_matches(name, _SPECS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(
            f"unknown minicomp option {name!r}{hint}; valid options: {', '.join(_SPECS)}"
        )
    return spec


def _allowed(spec: _Spec) -> str:
    if spec.choices is not None:
        text = "one of " + ", ".join(repr(c) for c in spec.choices)
    elif spec.minimum is not None:
        text = f"an int >= {spec.minimum}"
    elif spec.type is bool:
        text = "a bool (from the environment: " + "/".join(_TRUE_WORDS + _FALSE_WORDS) + ")"
    else:
        text = f"a {spec.type.__name__}"
    return text + (" or None" if spec.nullable else "")


def _bad(spec: _Spec, value: Any, origin: str) -> ValueError:
    return ValueError(
        f"invalid value {value!r} for minicomp option {spec.name!r} ({origin}): "
        f"expected {_allowed(spec)}"
    )


def _parse_env(spec: _Spec, text: str) -> Any:
    """Turn the text of an environment variable into a value of the option's type."""
    origin = f"from ${spec.env}"
    word = text.strip().lower()
    if spec.nullable and word in _NONE_WORDS:
        return None
    if spec.type is bool:
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
        raise _bad(spec, text, origin)
    if spec.type is int:
        try:
            return int(word)
        except ValueError:
            raise _bad(spec, text, origin) from None
    return text


def _check(spec: _Spec, value: Any, origin: str) -> Any:
    """Validate a Python value for an option and return it normalized."""
    if value is None:
        if spec.nullable:
            return None
        raise _bad(spec, value, origin)
    if spec.type is str and isinstance(value, os.PathLike):
        value = os.fspath(value)
    # bool is a subclass of int: keep True out of int options and 1 out of bool options.
    if not isinstance(value, spec.type) or (spec.type is int and isinstance(value, bool)):
        raise _bad(spec, value, origin)
    if spec.choices is not None and value not in spec.choices:
        raise _bad(spec, value, origin)
    if spec.minimum is not None and value < spec.minimum:
        raise _bad(spec, value, origin)
    if spec.name in ("cache_dir", "debug_dir"):
        value = os.path.expanduser(value)
    return value


def _env_or_default(spec: _Spec) -> Any:
    text = os.environ.get(spec.env)
    if text is None:
        return _check(spec, spec.default, "default")
    return _check(spec, _parse_env(spec, text), f"from ${spec.env}")


def resolve(options: Mapping[str, Any] | None = None, *, mode: str | None = None) -> Options:
    """Resolve every option for one compilation.

    Precedence, highest first: ``options`` (from ``torch.compile(..., options=...)``), values
    given to :func:`set` or :func:`patch`, ``MINICOMP_*`` environment variables, torch.compile's
    ``mode`` (see :func:`from_torch_mode`), defaults. A mode is a preset: an option set
    explicitly anywhere wins over it.
    """
    options = dict(options or {})
    for name in options:
        _spec(name)
    preset = from_torch_mode(mode)
    with _lock:
        overrides = dict(_overrides)
    values = {}
    for name, spec in _SPECS.items():
        if name in options:
            values[name] = _check(spec, options[name], "from torch.compile options")
        elif name in overrides:
            values[name] = overrides[name]
        elif name in preset and spec.env not in os.environ:
            values[name] = _check(spec, preset[name], f"from torch.compile mode {mode!r}")
        else:
            values[name] = _env_or_default(spec)
    return Options(**values)


def get(name: str) -> Any:
    """Return the current value of one option (set/patch > environment > default)."""
    spec = _spec(name)
    with _lock:
        if name in _overrides:
            return _overrides[name]
    return _env_or_default(spec)


def set(**kw: Any) -> None:
    """Set options for this process.

    They win over the environment and lose to torch.compile's ``options``. Raises ValueError,
    and sets nothing, when a name or a value is invalid.
    """
    checked = {name: _check(_spec(name), v, "from minicomp.config.set") for name, v in kw.items()}
    with _lock:
        _overrides.update(checked)


def reset(*option_names: str) -> None:
    """Forget values given to :func:`set` for the named options, or for all when none is named."""
    for name in option_names:
        _spec(name)
    with _lock:
        if option_names:
            for name in option_names:
                _overrides.pop(name, None)
        else:
            _overrides.clear()


@contextlib.contextmanager
def patch(**kw: Any) -> Iterator[None]:
    """Set options inside a ``with`` block and restore the previous settings on exit."""
    with _lock:
        saved = dict(_overrides)
    set(**kw)
    try:
        yield
    finally:
        with _lock:
            _overrides.clear()
            _overrides.update(saved)


_TORCH_MODES: dict[str | None, dict[str, Any]] = {
    None: {},
    "default": {},
    "reduce-overhead": {"cuda_graphs": True},
    "max-autotune": {"search_space": 2},
    "max-autotune-no-cudagraphs": {"search_space": 2, "cuda_graphs": False},
}


def from_torch_mode(mode: str | None) -> dict[str, Any]:
    """Map torch.compile's ``mode`` onto minicomp options (:func:`resolve` puts them under
    every explicitly set option).

    torch.compile passes ``mode`` to a backend other than Inductor as a keyword argument,
    ``backend(gm, example_inputs, mode=...)``, and only when it is given and not "default";
    it refuses ``mode`` and ``options`` together, so within one torch.compile call the mode
    competes only with :func:`set` and the environment.
    """
    if mode not in _TORCH_MODES:
        known = ", ".join(repr(m) for m in _TORCH_MODES)
        raise ValueError(f"unknown torch.compile mode {mode!r}; minicomp knows {known}")
    return dict(_TORCH_MODES[mode])


def _default_text(spec: _Spec) -> str:
    return "None" if spec.default is None else str(spec.default)


def describe(markdown: bool = False, width: int = 100) -> str:
    """Render a table of every option: name, type, environment variable, default and doc.

    ``markdown=True`` gives a Markdown table (docs/options.md); otherwise plain text, with each
    option's doc wrapped to ``width`` columns on the lines under its row.
    """
    header = ("option", "type", "environment variable", "default")
    rows = [(s.name, s.type_name, s.env, _default_text(s)) for s in _SPECS.values()]
    docs = [s.doc + _choices_note(s) for s in _SPECS.values()]
    if markdown:
        lines = ["| " + " | ".join((*header, "description")) + " |", "|---" * 5 + "|"]
        for row, doc in zip(rows, docs, strict=True):
            cells = [f"`{cell}`" for cell in row] + [doc]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        return "\n".join(lines) + "\n"
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]

    def render(row: tuple[str, ...]) -> str:
        cells = [cell.ljust(w) for cell, w in zip(row, widths, strict=False)]
        return "  ".join([*cells, row[-1]]).rstrip()

    lines = [render(header), render(tuple("-" * len(h) for h in header))]
    for row, doc in zip(rows, docs, strict=True):
        lines.append(render(row))
        lines.extend(textwrap.wrap(doc, width, initial_indent="    ", subsequent_indent="    "))
    return "\n".join(lines) + "\n"


def _choices_note(spec: _Spec) -> str:
    if spec.choices is None or spec.type is not str:
        return ""
    return " Choices: " + ", ".join(spec.choices) + "."
