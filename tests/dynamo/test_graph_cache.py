"""The whole-graph cache: a graph compiled again, in this process or a later one, is linked
from what its first compile kept, without minicomp's passes, and computes what eager does."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from minicomp import compiler
from minicomp.config import resolve
from minicomp.dynamo import graph_cache
from minicomp.dynamo.backend import KernelFallbackWarning, recording


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(24)
        self.up = torch.nn.Linear(24, 48)
        self.down = torch.nn.Linear(48, 24)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x)))).softmax(-1)


def _options(target, tmp_path, **more):
    return {"target": target, "cache_dir": str(tmp_path), "graph_cache": True, **more}


def _train_step(model, x, options):
    """Loss and gradients of one step of `model` compiled with `options`, with the records."""
    torch._dynamo.reset()
    model.zero_grad()
    records = []
    with recording(records):
        loss = torch.compile(model, backend="minicomp", options=options)(x).square().mean()
        loss.backward()
    return loss, [p.grad.clone() for p in model.parameters()], records


def _forbid_lowering(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the graph was lowered again")

    monkeypatch.setattr(compiler, "lower", fail)


def test_a_training_step_compiled_again_is_linked_from_the_cache(target, tmp_path, monkeypatch):
    model, options = Block(), _options(target, tmp_path)
    _, _, records = _train_step(model, torch.randn(4, 24), options)
    assert [r.cache.split()[0] for r in records] == ["stored", "stored"]

    _forbid_lowering(monkeypatch)
    x = torch.randn(4, 24)  # fresh values: nothing is cached but code
    loss, grads, records = _train_step(model, x, options)
    assert [r.cache.split()[0] for r in records] == ["hit", "hit"]
    assert all("passes" not in r.times and r.kernels for r in records)
    model.zero_grad()
    expected = model(x).square().mean()
    expected.backward()
    torch.testing.assert_close(loss, expected)
    for got, p in zip(grads, model.parameters()):
        torch.testing.assert_close(got, p.grad)


def test_another_shape_dtype_or_option_is_another_graph(target, tmp_path):
    def f(x):
        return torch.tanh(x) * 2 + 1

    def compile_once(x, **more):
        torch._dynamo.reset()
        records = []
        with recording(records):
            out = torch.compile(f, backend="minicomp", options=_options(target, tmp_path, **more))(
                x
            )
        torch.testing.assert_close(out, f(x))
        (record,) = records
        return record.cache.split()[0]

    assert compile_once(torch.randn(8, 3)) == "stored"
    assert compile_once(torch.randn(8, 3)) == "hit"
    assert compile_once(torch.randn(8, 5)) == "stored"
    assert compile_once(torch.randn(8, 3, dtype=torch.float64)) == "stored"
    assert compile_once(torch.randn(8, 3).t()) == "stored"  # other strides
    assert compile_once(torch.randn(8, 3), sm_count=8) == "stored"
    assert compile_once(torch.randn(8, 3), verbose=1) == "hit"  # printing changes no code
    assert compile_once(torch.randn(8, 3), graph_cache=False) == "off"


def test_a_dynamic_graph_is_kept_for_the_sizes_it_was_traced_at(target, tmp_path, monkeypatch):
    def f(x):
        return (x * x.sum(-1, keepdim=True)).relu()

    def run(x):
        torch._dynamo.reset()
        records = []
        options = _options(target, tmp_path)
        with recording(records):
            out = torch.compile(f, backend="minicomp", dynamic=True, options=options)(x)
        torch.testing.assert_close(out, f(x))
        return [r.cache.split()[0] for r in records]

    assert run(torch.randn(5, 7)) == ["stored"]
    # The importer checks sizes at the traced values: other ones are another entry.
    assert run(torch.randn(9, 3)) == ["stored"]
    _forbid_lowering(monkeypatch)
    assert run(torch.randn(5, 7)) == ["hit"]
    assert run(torch.randn(9, 3)) == ["hit"]


def test_the_warnings_of_kernels_that_failed_come_again_with_a_hit(target, tmp_path, monkeypatch):
    schedule = compiler.schedule_group

    def failing_schedule(op, *args, **kwargs):
        if any("sin" in member for member in op.members):
            raise RuntimeError("simulated scheduler failure on sin")
        return schedule(op, *args, **kwargs)

    def f(x, y):
        return torch.sin(x) * 2, (y + 1) ** 3

    x, y = torch.randn(8), torch.randn(8)
    monkeypatch.setattr(compiler, "schedule_group", failing_schedule)
    for expected in ("stored", "hit"):
        torch._dynamo.reset()
        records = []
        with recording(records), pytest.warns(KernelFallbackWarning, match="sin"):
            out = torch.compile(f, backend="minicomp", options=_options(target, tmp_path))(x, y)
        torch.testing.assert_close(out, f(x, y))
        assert records[0].cache.split()[0] == expected
        _forbid_lowering(monkeypatch)


def test_frozen_weights_are_not_kept(tmp_path):
    model = Block().eval()
    torch._dynamo.reset()
    records = []
    options = _options("cpu", tmp_path, freeze=True)
    with recording(records), torch.no_grad():
        out = torch.compile(model, backend="minicomp", options=options)(torch.ones(2, 24))
        torch.testing.assert_close(out, model(torch.ones(2, 24)))
    assert records[0].cache == "not kept: its weights are frozen into it"


def _traced(fn, *args):
    return make_fx(fn, tracing_mode="fake")(*args)


def test_the_key_covers_what_the_lowering_reads():
    options = resolve({"target": "cpu"})

    def key(gm, **more):
        return graph_cache.graph_key(gm, options, more.get("kind", "forward"), (), None)

    def add(x, y):
        return x + y

    def sub(x, y):
        return x - y

    a, b = torch.randn(4, 4), torch.randn(4, 4)
    base = key(_traced(add, a, b))
    assert key(_traced(add, torch.randn(4, 4), torch.randn(4, 4))) == base
    assert key(_traced(sub, a, b)) != base
    assert key(_traced(add, a, b[:, :1])) != base  # a broadcast: other shape
    assert key(_traced(add, a, b.t())) != base  # other strides
    assert key(_traced(add, a, a)) != base  # one storage read twice
    assert key(_traced(add, a, b), kind="backward") != base

    # A constant the graph holds is part of it, by value.
    gm = _traced(add, a, b)
    graph = gm.graph
    (y,) = [n for n in graph.nodes if n.name == "y_1"]
    gm.register_buffer("offset", torch.ones(4))
    with graph.inserting_after(y):
        const = graph.get_attr("offset")
    (added,) = [n for n in graph.nodes if n.op == "call_function"]
    added.args = (added.args[0], const)
    gm.recompile()
    ones = key(gm)
    gm.offset.fill_(2.0)
    assert key(gm) != ones


def test_a_later_process_links_the_graph_an_earlier_one_compiled(tmp_path):
    script = textwrap.dedent(
        """
        import sys, torch, torch.nn.functional as F
        from minicomp.dynamo.backend import recording
        torch.manual_seed(0)
        model = torch.nn.Sequential(  # the embedding's kernel checks its indices
            torch.nn.Embedding(20, 16), torch.nn.Linear(16, 32), torch.nn.GELU(),
            torch.nn.LayerNorm(32),
        )
        x = torch.randint(20, (3, 5), generator=torch.Generator().manual_seed(int(sys.argv[1])))
        options = {"target": "cpu", "cache_dir": sys.argv[2], "graph_cache": True}
        records = []
        with recording(records):
            out = torch.compile(model, backend="minicomp", options=options)(x)
            out.square().sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        model(x).square().sum().backward()
        ok = all(
            torch.allclose(g, p.grad, rtol=1e-3, atol=1e-4)
            for g, p in zip(grads, model.parameters())
        )
        import hashlib
        sources = hashlib.sha256("".join(r.source for r in records).encode()).hexdigest()
        same = ok and torch.allclose(out, model(x), atol=1e-5)
        print(" ".join(r.cache.split()[0] for r in records), same)
        print(sources)
        """
    )
    path = tmp_path / "step.py"
    path.write_text(script)
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    def run(seed):
        proc = subprocess.run(
            [sys.executable, str(path), str(seed), str(cache)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    *first, source = run(1)
    assert first == ["stored", "stored", "True"]
    # The same kernel source: the hit's kernels are the builds the first process made (its
    # IR unpickled in another process compares and renders as the original did).
    assert run(2) == ["hit", "hit", "True", source]
