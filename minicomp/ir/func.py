"""Functions (kernels, device functions, host functions) and modules of the kernel IR."""

from __future__ import annotations

from minicomp.ir.expr import Dim, Expr, Var
from minicomp.ir.node import Node, node
from minicomp.ir.stmt import Stmt
from minicomp.ir.types import DataType, PointerType

FUNC_KINDS = ("kernel", "device", "host")


MAX_CLUSTER = 8
"""The most CTAs a cluster may have (CUDA's portable cluster size)."""


@node
class LaunchAttrs(Node):
    """How a kernel is launched and compiled on the CUDA targets: the script DSL's `attrs.<field>`.

    A size below is an int, or an i64 expression over the kernel's scalar parameters that the
    runtime evaluates at every launch (minicomp.ir.symbols).

    - grid_dim: the blocks of the launch grid along (x, y, z), three sizes; None for functions
      not launched on a grid (device and host functions, cpu kernels).
    - block_dim: the threads of a block along (x, y, z), three sizes; None as for grid_dim.
      A constant block is also the kernel's `__launch_bounds__` unless launch_bounds is set.
    - dynamic_smem: the bytes of dynamic shared memory each block gets, a size; the "dynamic"
      DeclareArrays all point at its start.
    - launch_bounds: the most threads a block may have (the first argument of
      `__launch_bounds__`); None: the constant thread count of block_dim, if any.
    - min_blocks: the resident blocks per SM the register budget must leave room for (the
      second argument of `__launch_bounds__`); None: the compiler's choice. It needs a
      constant thread count (launch_bounds or a constant block_dim).
    - template: "name[config]" of the template that generated the kernel (reports, benchmarks,
      tests); None for the auto-scheduler's and hand-written kernels. It does not change the
      generated code.
    - scratch: memory the launcher provides beside the kernel's own tensors, each entry
      (parameter, elements, zeroed): pointer parameter `parameter` gets `elements` elements
      of its type, set to zero before the kernel's first launch when `zeroed` (a kernel must
      leave such memory zero again when it ends: the memory is the plan's for good, replayed
      launches included), else of undefined contents on every launch (a plan's workspace).
      Entries name the parameters in order; those parameters follow the outputs, before the
      scalar ones (runtime/plan_builder.py, Scratch).
    - block_group: blocks that finish one piece of work together through global memory (the
      chunks of one tile of an in-kernel split-K, matmul_tc): `block_group` consecutive
      blocks in linear order. A counted launch samples whole groups (emu.default_sample).
    - tensor_maps: the TMA tensor-map parameters a plan encodes at each launch (a template's
      operands read by TMA, matmul_hopper), each entry (map parameter, pointer parameter,
      base, shape, strides): the map describes the pointer parameter's buffer viewed from
      element `base` (an int) with `shape` and `strides` (in elements, outermost first,
      sizes: a symbolic M is the tensor's at each launch). Those
      parameters come first, in this order, before the buffers
      (backends/cuda/tensor_map.py, TensorMapArgument).
    - cluster_dim: the thread-block cluster, CTAs along (x, y, z), three constant ints whose
      product is 1 to 8 (sm_90); None: no cluster. Rendered `__cluster_dims__`; the grid must
      be a multiple of it along every axis (checked at each launch, symbols.launch_dims).
    """

    grid_dim: tuple[Dim, Dim, Dim] | None = None
    block_dim: tuple[Dim, Dim, Dim] | None = None
    dynamic_smem: Dim = 0
    launch_bounds: int | None = None
    min_blocks: int | None = None
    template: str | None = None
    scratch: tuple[tuple[str, int, bool], ...] = ()
    block_group: int = 1
    tensor_maps: tuple[tuple[str, str, int, tuple[Dim, ...], tuple[Dim, ...]], ...] = ()
    cluster_dim: tuple[int, int, int] | None = None

    def __post_init__(self):
        for name in ("grid_dim", "block_dim"):
            dims = getattr(self, name)
            if dims is not None and not (
                isinstance(dims, tuple) and len(dims) == 3 and all(map(_is_size, dims))
            ):
                raise TypeError(f"{name} is three ints or expressions (x, y, z), not {dims!r}")
        if not _is_size(self.dynamic_smem):
            raise TypeError(f"dynamic_smem is an int or an expression, not {self.dynamic_smem!r}")
        for name in ("launch_bounds", "min_blocks"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise TypeError(f"{name} is an int or None, not {value!r}")
        if self.template is not None and not isinstance(self.template, str):
            raise TypeError(f"template is a string or None, not {self.template!r}")
        if not isinstance(self.scratch, tuple) or not all(map(_is_scratch, self.scratch)):
            raise TypeError(
                f"scratch is a tuple of (parameter, elements, zeroed), not {self.scratch!r}"
            )
        if not isinstance(self.block_group, int) or self.block_group < 1:
            raise TypeError(f"block_group is a positive int, not {self.block_group!r}")
        if not isinstance(self.tensor_maps, tuple) or not all(map(_is_map, self.tensor_maps)):
            raise TypeError(
                "tensor_maps is a tuple of (map parameter, pointer parameter, base, shape, "
                f"strides), not {self.tensor_maps!r}"
            )

        c = self.cluster_dim
        if c is not None and not (
            isinstance(c, tuple)
            and len(c) == 3
            and all(type(d) is int and d >= 1 for d in c)
            and c[0] * c[1] * c[2] <= MAX_CLUSTER
        ):
            raise TypeError(
                f"cluster_dim is three positive ints (x, y, z) of at most {MAX_CLUSTER} CTAs, "
                f"not {c!r}"
            )

    def __repr__(self) -> str:
        default = LAUNCH_DEFAULTS
        fields = [f"{k}={v!r}" for k, v in self.items() if v != getattr(default, k)]
        return f"LaunchAttrs({', '.join(fields)})"

    def items(self) -> tuple[tuple[str, object], ...]:
        """(field name, value) of every field, in declaration order."""
        return tuple((k, getattr(self, k)) for k in self._field_names)


def _is_scratch(entry: object) -> bool:
    return (
        isinstance(entry, tuple)
        and len(entry) == 3
        and isinstance(entry[0], str)
        and isinstance(entry[1], int)
        and not isinstance(entry[1], bool)
        and entry[1] >= 0
        and isinstance(entry[2], bool)
    )


def _is_map(entry: object) -> bool:
    def sizes(t: object) -> bool:
        return isinstance(t, tuple) and all(map(_is_size, t))

    return (
        isinstance(entry, tuple)
        and len(entry) == 5
        and isinstance(entry[0], str)
        and isinstance(entry[1], str)
        and type(entry[2]) is int
        and sizes(entry[3])
        and sizes(entry[4])
        and len(entry[3]) == len(entry[4])
    )


def _is_size(d: object) -> bool:
    return isinstance(d, Expr) or isinstance(d, int) and not isinstance(d, bool)


LAUNCH_DEFAULTS = LaunchAttrs()
"""The attributes of a function that sets none (every field at its default)."""


@node
class Function(Node):
    """A function: a `kernel` (entry point launched by the runtime), `device` or `host` helper,
    with its launch attributes `attrs` (a kernel's grid and block, shared memory, hints)."""

    name: str
    params: tuple[Var, ...]
    body: Stmt
    kind: str = "kernel"
    ret: DataType | None = None
    attrs: LaunchAttrs = LAUNCH_DEFAULTS

    def __post_init__(self):
        if self.kind not in FUNC_KINDS:
            raise ValueError(f"unknown function kind {self.kind!r}")
        if not isinstance(self.attrs, LaunchAttrs):
            raise TypeError(f"attrs of {self.name} is a LaunchAttrs, not {self.attrs!r}")
        pointers = {p.name for p in self.params if isinstance(p.type, PointerType)}
        for name, _, _ in self.attrs.scratch:
            if name not in pointers:
                raise ValueError(f"scratch of {self.name}: {name} is not a pointer parameter")

    def __repr__(self) -> str:
        from minicomp.ir.printer import function_str

        return function_str(self)


@node
class Module(Node):
    """The functions compiled together into one binary."""

    name: str
    functions: tuple[Function, ...]

    def function(self, name: str) -> Function:
        """The function called `name`."""
        for f in self.functions:
            if f.name == name:
                return f
        raise KeyError(name)

    def __repr__(self) -> str:
        from minicomp.ir.printer import module_str

        return module_str(self)
