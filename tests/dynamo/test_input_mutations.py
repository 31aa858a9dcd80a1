"""Inference graphs that write into their inputs (a static KV cache, a running statistic) write
them in the inputs' own memory: the written rows only, or one kernel pass, never a new
whole-input tensor copied back after the call."""

import pytest
import torch
from helpers import assert_same, compile_minicomp
from torch import nn

from minicomp.dynamo.backend import recording
from minicomp.ir.graph import ExternOp, FusedOp

SEQ, HEADS, DIM = 16, 2, 8


class Cache(nn.Module):
    """A decode step's attention over a static KV cache written at the step's position."""

    def __init__(self, write: str, batch: int = 1):
        super().__init__()
        self.write = write
        shape = (batch, HEADS, SEQ, DIM)
        # Poisoned: a row the compiled step fails to write shows in the comparison.
        self.register_buffer("k", torch.randn(shape) * 100)
        self.register_buffer("v", torch.randn(shape) * 100)

    def forward(self, q, k, v, pos):
        if self.write == "index_copy_":
            self.k.index_copy_(2, pos, k)
            self.v.index_copy_(2, pos, v)
        elif self.write == "index_put_":
            rows = (torch.arange(k.shape[0])[:, None], torch.arange(HEADS)[None, :], pos)
            self.k.index_put_(rows, k[:, :, 0])
            self.v.index_put_(rows, v[:, :, 0])
        else:  # slice assignment at a position given as a tensor
            self.k[:, :, pos] = k
            self.v[:, :, pos] = v
        scores = (q @ self.k.transpose(-1, -2)).softmax(-1)
        return scores @ self.v


def step_inputs(batch: int = 1):
    return [torch.randn(batch, HEADS, 1, DIM) for _ in range(3)]


def whole_cache_writes(record, symbolic: bool = False) -> list[str]:
    """What in a compiled graph writes a new tensor of the cache's size, or copies into one
    (with `symbolic`, of any 4-d size whose sequence length is not 1)."""

    def cache_sized(v) -> bool:
        if symbolic:
            return len(v.shape) == 4 and v.shape[2] != 1
        return v.shape[-2:] == (SEQ, DIM)

    out = []
    for n in record.graph.nodes:
        written = [v for v in n.outputs if v.name not in record.graph.input_writes]
        if isinstance(n, FusedOp) and any(cache_sized(v) for v in written):
            out.append(n.name)
        if isinstance(n, ExternOp) and (n.mutates or not n.returns_views):
            if n.target is torch.ops.aten.index_put_.default:
                continue  # writes the given rows of the cache in place
            if any(cache_sized(v) for v in n.outputs):
                out.append(n.name)
    return out


@pytest.mark.parametrize("write", ["index_copy_", "index_put_", "slice assignment"])
def test_kv_cache_steps_match_eager(write, target):
    torch.manual_seed(0)
    eager = Cache(write)
    model = Cache(write)
    model.load_state_dict(eager.state_dict())
    compiled = compile_minicomp(model, target)
    records = []
    with torch.no_grad(), recording(records):
        for step in (3, 0, 15):
            q, k, v = step_inputs()
            pos = torch.tensor([step])
            assert_same(compiled(q, k, v, pos), eager(q, k, v, pos), atol=1e-4, rtol=1e-4)
            assert_same(model.k, eager.k)
            assert_same(model.v, eager.v)
    (record,) = records
    assert whole_cache_writes(record) == []
    assert len(record.graph.outputs) == 1  # no new cache for AOTAutograd to copy back
    in_place = [n for n in record.graph.nodes if isinstance(n, ExternOp) and n.mutates]
    assert [n.target for n in in_place] == [torch.ops.aten.index_put_.default] * 2


def attend(cache, q, k, pos):
    cache.index_copy_(2, pos, k)  # the cache is the caller's tensor, not a module buffer
    return (q @ cache.transpose(-1, -2)).softmax(-1)


def attend_at(cache, q, k, start: int):
    cache[:, :, start : start + 1] = k * 2  # a slice at a symbolic position
    return (q @ cache.transpose(-1, -2)).softmax(-1)


@pytest.mark.parametrize("fn", [attend, attend_at])
def test_kv_cache_with_dynamic_sizes(fn, target):
    torch.manual_seed(0)
    compiled = compile_minicomp(fn, target, dynamic=True)
    records = []
    with torch.no_grad(), recording(records):
        for batch, seq in ((2, 16), (3, 10)):
            cache = torch.randn(batch, HEADS, seq, DIM) * 100
            cache_eager = cache.clone()
            q, k, _ = step_inputs(batch)
            pos = torch.tensor([seq - 2]) if fn is attend else seq - 2
            out = compiled(cache, q, k, pos)
            assert_same(out, fn(cache_eager, q, k, pos), atol=1e-4, rtol=1e-4)
            assert_same(cache, cache_eager)
    assert records and all(not whole_cache_writes(r, symbolic=True) for r in records)


def scale_then_add(buf, x):
    buf.mul_(0.5).add_(x)
    return buf.sum(0)


def overwrite(buf, x):
    buf.copy_(x.sin())
    return x + 1


def sine_in_place(buf, x):
    buf.mul_(1e6).sin_()  # arguments where cpu's near sine falls back to the exact one
    return x + 1


def returns_the_new_value(buf, x):
    new = x * 2
    buf.copy_(new)
    return new  # its own memory in eager: not the buffer's


def flip_in_place(buf, x):
    buf.copy_(buf.flip(0) * x)  # each element reads another: not in place
    return x + 1


def assign_a_slice(buf, x):
    buf[:, 2:4] = x[:, :2].sin()  # the kernel computing it writes the two columns
    return x + 1


def assign_a_column_then_read(buf, x):
    buf[:, 3] = x[:, 0] * 2  # read below: a copy of the column at the end
    return buf.sum(1)


def read_old_after_write(buf, x, i):
    old = buf * 2  # computed by a kernel that may run after the write: it must see the old
    buf.index_copy_(0, i, x[:1])
    return old + buf


def write_a_view(buf, x):
    buf[1:3].mul_(x[1:3])
    return buf.sum()


def returns_the_input(buf, x):
    buf.add_(x)
    return buf


@pytest.mark.parametrize(
    "fn, fused",
    [
        (overwrite, True),
        (sine_in_place, True),
        (returns_the_input, True),
        (assign_a_slice, True),
        (assign_a_column_then_read, False),
        (scale_then_add, False),  # a reduction kernel reading the input: the copy stays
        (returns_the_new_value, False),
        (flip_in_place, False),
        (read_old_after_write, False),
        (write_a_view, False),
    ],
)
def test_input_mutations_match_eager(fn, fused, target):
    torch.manual_seed(0)
    compiled = compile_minicomp(fn, target)
    records = []
    with torch.no_grad(), recording(records):
        for _ in range(2):
            buf, x = torch.randn(4, 6), torch.randn(4, 6)
            args = (x, torch.tensor([2])) if fn is read_old_after_write else (x,)
            buf_eager = buf.clone()
            out, expected = compiled(buf, *args), fn(buf_eager, *args)
            assert_same(out, expected)
            assert_same(buf, buf_eager)
            buf.fill_(7.0), buf_eager.fill_(7.0)  # an output sharing buf's memory in one only
            assert_same(out, expected)
            if fn is returns_the_input:
                assert out.data_ptr() == buf.data_ptr()
    (record,) = records
    copies = [
        n for n in record.graph.nodes if getattr(n, "target", None) is torch.ops.aten.copy_.default
    ]
    assert bool(record.graph.input_writes) == fused
    assert copies == [] if fused else len(copies) == 1


def test_inputs_sharing_memory(target):
    def double_a_read_b(a, b):
        a.mul_(2)
        return b + 1  # b is a view of a: it sees the new values

    torch.manual_seed(0)
    compiled = compile_minicomp(double_a_read_b, target)
    with torch.no_grad():
        base = torch.randn(6, 4)
        base_eager = base.clone()
        out = compiled(base[:4], base[2:])
        assert_same(out, double_a_read_b(base_eager[:4], base_eager[2:]))
        assert_same(base, base_eager)


def test_training_graphs_keep_mutations_out_of_the_graph():
    # The same AOTAutograd path on every target: cpu alone.
    torch.manual_seed(0)
    model = nn.BatchNorm1d(4)
    eager = nn.BatchNorm1d(4)
    compiled = compile_minicomp(model, "cpu")
    records = []
    with recording(records):
        for _ in range(2):
            x = torch.randn(8, 4, requires_grad=True)
            compiled(x).sum().backward()
            eager(x.detach().requires_grad_()).sum().backward()
            assert_same(model.running_mean, eager.running_mean)
            assert_same(model.running_var, eager.running_var)
    assert all(not r.graph.input_writes for r in records if r.graph is not None)
