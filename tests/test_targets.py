"""Targets: how one is resolved, and what each one decides."""

import dataclasses
import types

import numpy as np
import pytest
import torch
from graph_builder import GraphBuilder, evaluate_graph, random_inputs

from minicomp import config
from minicomp.compiler import compile_graph
from minicomp.ir import expr as E
from minicomp.passes.graph.anchors import lower_anchors
from minicomp.passes.graph.attention import lower_attention
from minicomp.passes.graph.attention_backward import lower_attention_backward
from minicomp.passes.graph.int8_weight_products import int8_weight_products
from minicomp.passes.graph.layout import contiguous_kernel_inputs
from minicomp.passes.graph.library_calls import name_library_calls
from minicomp.passes.graph.onednn_convolution import onednn_convolutions
from minicomp.passes.graph.onednn_linear import onednn_linears
from minicomp.passes.graph.small_channels import pad_small_channels
from minicomp.passes.graph.split_k import split_k
from minicomp.passes.pipeline import DEFAULT_PASSES, FIRST_PASSES
from minicomp.record import CompileRecord
from minicomp.script.custom_op import lower_script_ops
from minicomp.targets import TARGETS, CpuTarget, get_target, resolve_target, script_target


def test_every_target_is_registered_under_its_name_and_is_an_option_choice():
    assert {name: t.name for name, t in TARGETS.items()} == {n: n for n in TARGETS}
    choices = {f.name: f.metadata["choices"] for f in dataclasses.fields(config.Options)}
    assert set(choices["target"]) == {"auto", *TARGETS}


@pytest.mark.parametrize(
    "requested, devices, expected",
    [
        ("auto", {"cpu"}, "cpu"),
        ("auto", set(), "cpu"),
        ("auto", {"cpu", "cuda"}, "cuda"),
        ("cpu", {"cpu"}, "cpu"),
        ("cuda-emu", {"cpu"}, "cuda-emu"),
        ("cuda", {"cuda", "cpu"}, "cuda"),
        ("cuda", set(), "cuda"),
    ],
)
def test_resolve_target(requested, devices, expected):
    assert resolve_target(requested, devices) is TARGETS[expected]


@pytest.mark.parametrize(
    "requested, devices, message",
    [
        ("cpu", {"cuda"}, "target 'cpu' runs kernels on CPU tensors.*use target='cuda'"),
        ("cuda-emu", {"cpu", "cuda"}, "target 'cuda-emu' runs kernels on CPU tensors"),
        ("cuda", {"cpu"}, "target 'cuda' needs tensors on a CUDA device; this graph's are on cpu"),
        ("tpu", {"cpu"}, "unknown target 'tpu'; the targets are cpu, cuda, cuda-emu"),
    ],
)
def test_a_target_that_cannot_run_the_graph_is_refused(requested, devices, message):
    with pytest.raises(ValueError, match=message):
        resolve_target(requested, devices)


def test_pass_lists():
    cpu, emu, cuda = (get_target(n) for n in ("cpu", "cuda-emu", "cuda"))
    # The cpu target names its library calls first (ATen by design), and its convolutions
    # and products become oneDNN calls last (products over int8 weights ATen's int8 kernel).
    assert list(cpu.passes) == [
        name_library_calls,
        *FIRST_PASSES,
        *DEFAULT_PASSES,
        onednn_convolutions,
        int8_weight_products,
        onednn_linears,
    ]
    assert emu.passes == cuda.passes
    # Anchors are lowered before the default passes see them; attention launches come last.
    assert emu.passes.index(lower_anchors) < emu.passes.index(DEFAULT_PASSES[0])
    # Convolutions over few channels are computed from padded copies before anchors lowers
    # the others.
    assert emu.passes.index(pad_small_channels) == emu.passes.index(lower_anchors) - 1
    assert emu.passes[-2:] == (lower_attention, lower_attention_backward)


def _exp_times_x():
    b = GraphBuilder()
    x = b.input("x", (8,))
    b.output(b.compute("y", (8,), lambda i: E.call("exp", x[i]) * x[i]))
    return b.build()


def test_script_ops_add_their_passes_only_where_the_graph_has_some():
    graph = _exp_times_x()
    emu = get_target("cuda-emu")
    assert emu.passes_for(graph) == list(emu.passes)
    assert lower_script_ops not in emu.passes and contiguous_kernel_inputs not in emu.passes


def test_script_kernels_run_on_the_targets_that_compile_cuda():
    options = config.resolve()
    assert script_target(None, torch.device("cpu"), options).name == "cuda-emu"
    assert script_target("cuda", None, options).name == "cuda"
    with pytest.raises(ValueError, match="a script kernel runs on cuda or cuda-emu, not 'cpu'"):
        script_target("cpu", None, options)


def test_the_compiler_asks_the_target(monkeypatch):
    """A target deriving from another overrides only what differs; the compiler asks it."""
    asked = []

    class LoggingCpu(CpuTarget):
        name = "cpu"

        def schedule(self, op, layouts, choose, options):
            asked.append(op.name)
            return super().schedule(op, layouts, choose, options)

    graph = _exp_times_x()
    monkeypatch.setitem(TARGETS, "cpu", LoggingCpu())
    plan = compile_graph(graph, config.resolve({"target": "cpu"}), CompileRecord())
    inputs = random_inputs(graph)
    (expected,) = evaluate_graph(graph, inputs)
    (actual,) = plan(torch.from_numpy(inputs["x"]))
    np.testing.assert_allclose(actual.numpy(), expected, rtol=1e-6)
    assert len(asked) == 1


@pytest.mark.parametrize("name", ["cpu", "cuda-emu"])
@pytest.mark.parametrize("device, sms", [("h100", 132), ("a100", 108)])
def test_targets_without_a_gpu_count_the_sms_of_the_lens_device(name, device, sms):
    options = config.Options(lens_device=device)
    assert TARGETS[name].sm_count(options, None) == sms


def test_the_cuda_target_counts_the_sms_of_its_device():
    asked = []

    def properties(index):
        asked.append(index)
        return types.SimpleNamespace(multi_processor_count=16)

    options = config.Options(lens_device="a100")  # not what a GPU target asks
    assert TARGETS["cuda"].sm_count(options, 3, get_properties=properties) == 16
    assert asked == [3]


@pytest.mark.parametrize(
    "given, expected", [({}, 132), ({"lens_device": "a100"}, 108), ({"sm_count": 16}, 16)]
)
def test_the_compiler_resolves_the_sm_count_once_from_the_target(monkeypatch, given, expected):
    """Unset, the count is the target's (cuda-emu: the lens's device); set, it is kept. The
    scheduler sees the resolved options."""
    seen = []

    class LoggingEmu(TARGETS["cuda-emu"].__class__):
        def schedule(self, op, layouts, choose, options):
            seen.append(options.sm_count)
            return super().schedule(op, layouts, choose, options)

    record = CompileRecord()
    options = config.resolve({"target": "cuda-emu", **given})
    monkeypatch.setitem(TARGETS, "cuda-emu", LoggingEmu())
    compile_graph(_exp_times_x(), options, record)
    assert record.options.sm_count == expected
    assert seen == [expected]


def test_the_cuda_pass_list_sizes_its_passes_for_the_sm_count_under_their_own_names():
    emu = get_target("cuda-emu")
    passes = emu.passes_for(_exp_times_x(), config.Options(sm_count=16))
    assert [p.__name__ for p in passes] == [p.__name__ for p in emu.passes]
    sized = {p.func: p.keywords for p in passes if hasattr(p, "func")}
    assert sized == {
        split_k: {"sms": 16},
        lower_attention: {"sms": 16},
        lower_attention_backward: {"sms": 16},
    }
