"""Imports point down the layers: a module imports only from lower layers or its own part,
and the modules of one package import each other without cycles.

The layers, bottom to top (docs/architecture.md, "Layers"). Parts on one
layer are siblings and import nothing of each other. Every import counts, the ones inside
functions too: a lazy import does not make an upward dependency go away, nor a cycle.
"""

import ast
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "minicomp"

# (layer, part): a part is a module prefix; the longest prefix matching a module wins.
LAYERS = {
    "minicomp.ir": 0,
    # minicomp's names in torch._logging; loaded alone while torch is imported, so it imports
    # nothing of minicomp.
    "minicomp.logs": 0,
    "minicomp.ops": 1,
    # The script DSL's language (what templates are written in); building and launching
    # script kernels and the PyTorch custom-op glue sit higher up.
    "minicomp.script": 1,
    "minicomp.passes.kernel": 2,
    "minicomp.backends": 2,
    # A script function as users and templates hold it: parsed, simplified, its CUDA C
    # rendered. The language below knows it only as lang.ScriptFunctionBase.
    "minicomp.script.function": 2.5,
    # Script text read back into IR through ScriptFunctions (the printer's round trip).
    "minicomp.script.text": 2.75,
    "minicomp.config": 2.5,
    "minicomp.schedule": 3,
    # Graph passes sit above the schedulers: the attention and contraction rewrites instantiate
    # templates.
    "minicomp.passes.graph": 4,
    # Script kernels as PyTorch custom ops, and their calls lowered to kernel launches.
    "minicomp.script.custom_op": 4.5,
    # The performance lens: emulator counters, occupancy and the roofline estimate the tuner
    # ranks by.
    "minicomp.lens": 4.75,
    "minicomp.passes.pipeline": 5,
    "minicomp.passes.__init__": 5,
    "minicomp.runtime": 5,
    "minicomp.tune": 5,
    "minicomp.record": 6,
    "minicomp.targets": 6,
    "minicomp.compiler": 7,
    "minicomp.script.launch": 7,
    "minicomp.script.__init__": 7.5,
    "minicomp.dynamo": 8,
    "minicomp.explain": 9,
    "minicomp.profile": 9,
    "minicomp.bench": 9,
    "minicomp.fuzz": 9,
    "minicomp.cli": 10,
    "minicomp.__init__": 11,
    "minicomp.__main__": 11,
}

# Upward or sideways imports the code has today, each to be removed; the test fails when one
# is gone (delete its line) as when a new one appears. None today: keep it so.
KNOWN: set[tuple[str, str]] = set()

# Import cycles among the modules of one package (minicomp.<name>, subpackages included), each
# the set of modules that import each other round, to be broken; the test fails when one is
# gone (delete it) as when a new one appears.
KNOWN_CYCLES = {
    # IR nodes print themselves with the printer (lazily), which knows every node class.
    frozenset(
        {
            "minicomp.ir.compute",
            "minicomp.ir.expr",
            "minicomp.ir.func",
            "minicomp.ir.graph",
            "minicomp.ir.printer",
            "minicomp.ir.stmt",
        }
    ),
    # NVRTC's install hint asks the driver's CUDA version; the driver's hint for a cubin it
    # refuses asks NVRTC's.
    frozenset({"minicomp.backends.cuda.driver", "minicomp.backends.cuda.nvrtc"}),
}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)


def part_of(module: str) -> str:
    """The longest LAYERS prefix of `module`."""
    parts = [p for p in LAYERS if module == p or module.startswith(p + ".")]
    assert parts, f"{module} has no layer: add it to LAYERS"
    return max(parts, key=len)


MODULES = {module_name(p) for p in PACKAGE.rglob("*.py")}
MODULES |= {m.removesuffix(".__init__") for m in MODULES}


def imports_of(here: str, source: str) -> set[str]:
    """The minicomp modules the module `here` (its `source`) imports, anywhere in it."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: -node.level]
                node_module = ".".join(base + ([node.module] if node.module else []))
            else:
                node_module = node.module or ""
            for a in node.names:
                # `from minicomp import config` imports the module minicomp.config; `from
                # minicomp.script import attrs` a name the package's __init__ defines.
                if f"{node_module}.{a.name}" in MODULES:
                    out.add(f"{node_module}.{a.name}")
                elif f"{node_module}.__init__" in MODULES:
                    out.add(f"{node_module}.__init__")
                else:
                    out.add(node_module)
    return {m for m in out if m in MODULES and m.startswith("minicomp.")}


def upward_imports(extra: dict[str, str] | None = None) -> set[tuple[str, str]]:
    """(importer, imported) for every import that does not point down or stay in its part,
    over the package's modules and `extra` (module name -> source)."""
    sources = {module_name(p): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}
    found = set()
    for here, source in {**sources, **(extra or {})}.items():
        src = part_of(here)
        for target in imports_of(here, source):
            if target == "minicomp":
                continue
            dst = part_of(target)
            if dst == src:
                continue
            if LAYERS[dst] >= LAYERS[src]:
                found.add((here.removesuffix(".__init__"), target))
    return found


PACKAGES = {module_name(p).removesuffix(".__init__") for p in PACKAGE.rglob("__init__.py")}


def import_cycles(extra: dict[str, str] | None = None) -> set[frozenset[str]]:
    """The import cycles among the modules of each package (minicomp.<name> and everything
    under it), as sets of modules, over the package's modules and `extra` (name -> source)."""
    sources = {module_name(p): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}
    graph = nx.DiGraph()
    for here, source in {**sources, **(extra or {})}.items():
        here = here.removesuffix(".__init__")
        for target in imports_of(here, source):
            target = target.removesuffix(".__init__")
            # A package's __init__ runs before any module of it, whichever imports it first:
            # `from minicomp.script import lang` is a dependency on lang alone.
            if target in PACKAGES or target == here:
                continue
            if target.split(".")[:2] == here.split(".")[:2]:
                graph.add_edge(here, target)
    return {frozenset(c) for c in nx.strongly_connected_components(graph) if len(c) > 1}


def test_imports_point_down_the_layers():
    found = upward_imports()
    new = sorted(found - KNOWN)
    gone = sorted(KNOWN - found)
    assert not new, "imports pointing up or sideways:\n" + "\n".join(f"{a} -> {b}" for a, b in new)
    assert not gone, "fixed, remove from KNOWN:\n" + "\n".join(f"{a} -> {b}" for a, b in gone)


def test_no_import_cycles_within_a_package():
    found = import_cycles()
    new = [sorted(c) for c in found - KNOWN_CYCLES]
    gone = [sorted(c) for c in KNOWN_CYCLES - found]
    assert not new, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in new)
    assert not gone, "fixed, remove from KNOWN_CYCLES:\n" + "\n".join(" <-> ".join(c) for c in gone)


def test_a_lazy_import_closing_a_cycle_is_caught():
    # runner imports options at the top; options importing runner back, inside a function.
    found = import_cycles({"minicomp.bench.options": "def f():\n    from . import runner\n"})
    assert any({"minicomp.bench.options", "minicomp.bench.runner"} <= c for c in found)


@pytest.mark.parametrize(
    "source",
    [
        "from minicomp.dynamo import backend\n",
        "def f():\n    import minicomp.dynamo.backend\n",  # a lazy import counts too
        "from ..dynamo import backend\n",
    ],
)
def test_an_upward_import_is_caught(source):
    found = upward_imports({"minicomp.ir.planted": source})
    assert ("minicomp.ir.planted", "minicomp.dynamo.backend") in found


def test_a_name_a_package_defines_is_an_import_of_its_init():
    found = upward_imports({"minicomp.schedule.planted": "from minicomp.script import attrs\n"})
    assert ("minicomp.schedule.planted", "minicomp.script.__init__") in found
    found = upward_imports({"minicomp.schedule.planted": "from minicomp.script import lang\n"})
    assert not any(here == "minicomp.schedule.planted" for here, _ in found)


def test_a_sideways_import_is_caught():
    found = upward_imports(
        {"minicomp.passes.kernel.planted": "from minicomp.backends import cache\n"}
    )
    assert ("minicomp.passes.kernel.planted", "minicomp.backends.cache") in found


@pytest.mark.parametrize("module", ["minicomp.ir.expr", "minicomp.schedule.templates.matmul"])
def test_parts_are_found_by_longest_prefix(module):
    assert LAYERS[part_of(module)] == LAYERS[".".join(module.split(".")[:2])]
