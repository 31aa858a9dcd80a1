"""options={"freeze": True}: parameters and buffers become constants of the compiled graph,
what depends on them alone is folded at compile time, and results stay eager's."""

import os
import warnings

import pytest
import torch
from helpers import assert_same, clone_inputs

from minicomp.dynamo import backend
from minicomp.dynamo.backend import FREEZE_NEEDS_GRAD, recording
from minicomp.ir.graph import ExternOp, FusedOp, Graph, Value

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # configs are built here; nothing is downloaded

TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}


def compile_frozen(fn, target: str, **options):
    torch._dynamo.reset()
    options = {"target": target, "fallback": "error", "freeze": True, **options}
    return torch.compile(fn, backend="minicomp", options=options)


def run_frozen(fn, *inputs, target: str, freeze: bool = True):
    """Compile `fn` (with or without freezing) and compare it with eager under no_grad; the
    forward graph's CompileRecord."""
    records: list = []
    with torch.no_grad():
        expected = fn(*clone_inputs(inputs))
        with recording(records):
            compiled = compile_frozen(fn, target, freeze=freeze)
            actual = compiled(*clone_inputs(inputs))
        assert_same(actual, expected, **TOLERANCE)
        # A second call runs the same plan on other values.
        fresh = clone_inputs(inputs)
        for t in fresh:
            if t.is_floating_point():
                t.normal_()
        assert_same(compiled(*fresh), fn(*fresh), **TOLERANCE)
    (record,) = records
    assert record.error == ""
    return record


def tensor_inputs(graph: Graph) -> list[Value]:
    return [v for v in graph.inputs if isinstance(v, Value)]


def constant_only_ops(graph: Graph) -> list[str]:
    """Operators that read constants and nothing else: folding should have computed them."""
    return [
        n.name for n in graph.nodes if n.inputs and all(v.name in graph.constants for v in n.inputs)
    ]


def permutes(graph: Graph) -> list[str]:
    """Transposes left in the graph, as ATen calls (aliases) or members of fused kernels."""
    names = [n.name for n in graph.nodes if isinstance(n, ExternOp)]
    names += [m for n in graph.nodes if isinstance(n, FusedOp) for m in n.members]
    return [name for name in names if "permute" in name]


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)
    ).eval()


def test_mlp_weights_become_folded_constants(target):
    model = mlp()
    x = torch.randn(4, 16)
    plain = run_frozen(model, x, target=target, freeze=False)
    frozen = run_frozen(model, x, target=target)
    # The compiled function takes the activation only; the weights are constants.
    assert [v.shape for v in tensor_inputs(frozen.graph)] == [(4, 16)]
    assert len(tensor_inputs(plain.graph)) == 5
    # The matmuls read the weights transposed: strided views of the parameters' memory.
    storages = {p.untyped_storage().data_ptr(): p for p in model.parameters() if p.dim() == 2}
    weights = [t for t in frozen.graph.constants.values() if t.dim() == 2]
    assert sorted(t.shape for t in weights) == [(16, 32), (32, 8)]
    for t in weights:
        assert torch.equal(t, storages[t.untyped_storage().data_ptr()].t())
    # The weights' transposes ran once, at compile time: none is left for the plan.
    assert permutes(plain.graph) and not permutes(frozen.graph)
    assert constant_only_ops(frozen.graph) == []
    # On the cpu target each transpose was a step of the plan (an alias); on the CUDA targets
    # it was inlined into the matmul kernel's operand loads.
    fewer = len(frozen.graph.nodes) < len(plain.graph.nodes)
    assert fewer if target == "cpu" else len(frozen.graph.nodes) == len(plain.graph.nodes)


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.bn2 = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.fc(x.mean(dim=(2, 3)))


def conv_net() -> torch.nn.Module:
    torch.manual_seed(0)
    model = ConvNet().eval()
    for bn in (model.bn1, model.bn2):  # statistics of a trained model, not the identity
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.data.normal_()
        bn.bias.data.normal_()
    return model


def test_conv_net_with_batch_norm(target):
    model = conv_net()
    record = run_frozen(model, torch.randn(2, 3, 12, 12), target=target)
    assert [v.shape for v in tensor_inputs(record.graph)] == [(2, 3, 12, 12)]
    # Weights and biases are constants now, the batch norms folded into the convolutions':
    # two folded weights and biases, the linear's weight (transposed) and bias.
    assert len(record.graph.constants) == 6
    assert constant_only_ops(record.graph) == []


def batch_norm_ops(graph: Graph) -> list[str]:
    """The ATen ops of batch norms the compiled graph still computes (as kernels or calls)."""
    names = [n.name for n in graph.nodes if not isinstance(n, FusedOp)]
    names += [m for n in graph.nodes if isinstance(n, FusedOp) for m in n.members]
    return [name for name in names if "batch_norm" in name]


def test_batch_norms_fold_into_convolution_weights(target):
    model = conv_net()
    x = torch.randn(2, 3, 12, 12)
    plain = run_frozen(model, x, target=target, freeze=False)
    frozen = run_frozen(model, x, target=target)
    # Unfrozen, the statistics are inputs and each batch norm is computed on every call.
    assert len(batch_norm_ops(plain.graph)) == 2
    # Frozen, both fold into their convolution's weight and bias (conv1 has no bias of its own).
    assert batch_norm_ops(frozen.graph) == []
    folded = [name for name in frozen.graph.constants if name.endswith("_folded_weight")]
    assert len(folded) == 2


def test_folded_batch_norm_in_channels_last(target):
    # Eager's channels-last strides survive the folding (assert_same compares strides).
    model = conv_net().to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 12, 12).to(memory_format=torch.channels_last)
    record = run_frozen(model, x, target=target)
    assert batch_norm_ops(record.graph) == []


def test_channels_last_conv_weight_is_stored_k_major_on_cuda_targets(target):
    model = conv_net().to(memory_format=torch.channels_last)
    assert not model.conv1.weight.is_contiguous()
    record = run_frozen(model, torch.randn(2, 3, 12, 12), target=target)
    weights = [t for t in record.graph.constants.values() if t.shape == (8, 8, 3, 3)]
    assert len(weights) == 1
    # The implicit GEMM's K is (c, r, s): row-major OIHW puts it innermost and contiguous.
    # On the cpu target ATen's convolution reads the weight, which stays as it is.
    assert weights[0].is_contiguous() == (target != "cpu")


def test_tiny_gpt2(target):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=32,
        bos_token_id=0, eos_token_id=0, attn_implementation="sdpa",
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(config).eval()

    def logits(input_ids):
        return model(input_ids=input_ids, use_cache=False).logits

    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    record = run_frozen(logits, ids, target=target)
    assert [v.shape for v in tensor_inputs(record.graph)] == [(2, 8)]
    assert constant_only_ops(record.graph) == []
    # The language-model head reads the tied embedding transposed: folded to a strided view
    # of the embedding's memory, not copied.
    wte = model.transformer.wte.weight
    assert any(
        t.untyped_storage().data_ptr() == wte.untyped_storage().data_ptr() and t.stride() == (1, 32)
        for t in record.graph.constants.values()
    )


def test_graph_needing_gradients_is_not_frozen_and_warns():
    model = mlp().train()
    x = torch.randn(4, 16)
    expected = model(x).square().sum()
    expected.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    records: list = []
    with recording(records), pytest.warns(UserWarning, match="computes gradients"):
        loss = compile_frozen(model, "cpu")(x).square().sum()
    loss.backward()
    torch.testing.assert_close(loss, expected)
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g)
    forward = next(r for r in records if r.kind == "forward")
    assert len(tensor_inputs(forward.graph)) == 5  # the parameters stay inputs
    assert FREEZE_NEEDS_GRAD.startswith("minicomp")


def test_mutated_buffers_stay_inputs():
    # Batch norm in training mode updates its running statistics: frozen, the update would
    # be lost to the next call.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.BatchNorm1d(4)).train()
    reference = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.BatchNorm1d(4)).train()
    reference.load_state_dict(model.state_dict())
    records: list = []
    with torch.no_grad(), recording(records):
        compiled = compile_frozen(model, "cpu")
        for _ in range(2):
            x = torch.randn(8, 6)
            assert_same(compiled(x), reference(x), **TOLERANCE)
    torch.testing.assert_close(model[1].running_mean, reference[1].running_mean)
    torch.testing.assert_close(model[1].running_var, reference[1].running_var)
    (record,) = records
    # The activation, the running mean and variance and the batch counter stay inputs; the
    # weights and biases are constants.
    shapes = sorted(v.shape for v in tensor_inputs(record.graph))
    assert shapes == [(), (4,), (4,), (8, 6)]
    assert len(record.graph.constants) >= 3


def test_each_module_instance_gets_plan_with_its_own_weights(monkeypatch):
    first, second, third = mlp(), mlp(), mlp()
    for p in (*second.parameters(), *third.parameters()):
        p.data.normal_()
    x = torch.randn(4, 16)
    with torch.no_grad():
        # Dynamo does not guard on parameters' identity: all three reach one graph.
        compiled = compile_frozen(lambda m, x: m(x), "cpu")
        for model in (first, second, first):
            assert_same(compiled(model, x), model(x), **TOLERANCE)
        monkeypatch.setattr(backend, "MAX_FROZEN_PLANS", 2)
        with pytest.raises(RuntimeError, match="freeze"):
            compiled(third, x)
        torch._dynamo.reset()
        lenient = torch.compile(
            lambda m, x: m(x),
            backend="minicomp",
            options={"target": "cpu", "freeze": True, "fallback": "eager"},
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for model in (first, second, third):
                assert_same(lenient(model, x), model(x), **TOLERANCE)
        assert any("runs eagerly" in str(w.message) for w in caught)
