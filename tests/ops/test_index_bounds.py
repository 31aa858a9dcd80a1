"""An index tensor holding a value out of range raises eager's error, where a kernel would
read out of bounds: the kernel keeps its load in bounds, stores a code in its error flag and
the plan raises after it (ir/error_flag.py)."""

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_same, compile_minicomp

import minicomp


def index_select(x, i):
    return x.index_select(0, i) * 2


def embedding(x, i):
    return F.embedding(i, x) + 1


def gather(x, i):
    return x.gather(0, i.unsqueeze(1).expand(-1, x.shape[1])).relu()


def advanced_index(x, i):
    return x[i, 1:] - 1


def take(x, i):
    return torch.take(x[:, 2], i)  # SIZE elements, strided


def embedding_then_reduce(x, i):
    # The checked read sits inside a fused reduction.
    return F.embedding(i, x).sum(dim=-1).softmax(dim=0)


OPS = [index_select, embedding, gather, advanced_index, take, embedding_then_reduce]
SIZE = 7


def bad_indices(fn, where: str) -> torch.Tensor:
    """Fresh valid indices into SIZE rows with one out-of-range value at `where`."""
    i = torch.randint(0, SIZE, (13,))
    low = -SIZE - 1 if fn in (advanced_index, take) else -1  # those two wrap negatives once
    bad = {"first": SIZE, "last": SIZE + 5, "negative": low}[where]
    i[0 if where == "first" else -1] = bad
    return i


def eager_error(fn, *args) -> BaseException:
    with pytest.raises(Exception) as info:
        fn(*args)
    return info.value


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("where", ["first", "last", "negative"])
@pytest.mark.parametrize("fn", OPS)
def test_an_index_out_of_range_raises_like_eager(fn, where, dynamic, target):
    x = torch.randn(SIZE, 5)
    i = bad_indices(fn, where)
    expected = eager_error(fn, x, i)
    compiled = compile_minicomp(fn, target, dynamic=dynamic)
    with pytest.raises(type(expected), match="out of range|out of bounds"):
        compiled(x, i)
    # The flag is reset: the next call with good indices gives eager's answer.
    good = torch.randint(0, SIZE, (13,))
    assert_same(compiled(x, good), fn(x, good))


def test_an_index_into_an_empty_dimension_raises_like_eager(target):
    x = torch.randn(0, 5)
    i = torch.tensor([0])
    expected = eager_error(index_select, x, i)
    with pytest.raises(type(expected)):
        compile_minicomp(index_select, target)(x, i)


def test_generated_cuda_with_index_checks_compiles_with_nvrtc(tmp_path):
    from minicomp.backends.cuda import nvrtc

    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(str(err))
    x, i = torch.randn(SIZE, 5), torch.randint(0, SIZE, (13,))
    options = {"target": "cuda-emu", "fallback": "error"}
    for fn in OPS:
        [record] = minicomp.explain(fn, x, i, options=options).records
        assert "mc_checked_index(" in record.source.split("#endif /* MINICOMP_")[-1]
        binary = nvrtc.compile_cuda(record.source, arch="sm_90", cache_dir=str(tmp_path))
        assert " warning" not in binary.log, binary.log
