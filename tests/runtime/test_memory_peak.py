"""Peak memory: a compiled plan holds no more memory at once than eager PyTorch running the same
model, measured the same way for both (the bytes of the tensor storages a call creates that
are alive at once)."""

import gc
import os
import weakref

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from minicomp.dynamo.backend import recording

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # configs are built here; nothing is downloaded
transformers = pytest.importorskip("transformers")


class StorageTracker(TorchDispatchMode):
    """Tracks the bytes of the storages that ATen ops create while the mode is active and
    that are still alive: each new storage counts from the op returning it until it is freed
    (views share their base's storage and count nothing). Memory ATen kernels allocate and
    free inside one op is not seen, for eager and compiled calls alike."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self.seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # A view of an input, or an in-place result, is no new memory (the input may be a
        # parameter or an argument, which exist before the call).
        known = {id(t.untyped_storage()) for t in _tensors((args, kwargs))}
        out = func(*args, **kwargs)
        for t in _tensors(out):
            storage = t.untyped_storage()
            if id(storage) not in known:
                self._track(storage)
        return out

    def _track(self, storage) -> None:
        # A storage keeps its Python object while it lives, so the object's finalizer runs
        # when the memory is freed.
        key = id(storage)
        if key in self.seen:
            return
        nbytes = storage.nbytes()
        self.seen.add(key)
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, key, nbytes)

    def _free(self, key: int, nbytes: int) -> None:
        self.seen.discard(key)
        self.live -= nbytes


def _tensors(tree) -> list[torch.Tensor]:
    # Opaque tensors (a oneDNN-prepacked weight) have no storage to count; they are made once,
    # at compile time.
    leaves = pytree.tree_leaves(tree)
    return [t for t in leaves if isinstance(t, torch.Tensor) and t.layout == torch.strided]


def peak_bytes(fn, *args) -> int:
    """The most bytes of storages created by `fn(*args)` alive at once (outputs included)."""
    with torch.no_grad(), StorageTracker() as tracker:
        out = fn(*args)
        del out
    gc.collect()  # transformers' outputs hold reference cycles
    assert tracker.live == 0, "the call left storages alive"
    return tracker.peak


def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=64, vocab_size=128, n_positions=64,
        bos_token_id=0, eos_token_id=0, attn_implementation="sdpa",
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    return model, (lambda input_ids: model(input_ids=input_ids, use_cache=False).logits), ids


def resnet():
    torch.manual_seed(0)
    config = transformers.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1])
    model = transformers.ResNetModel(config).eval()
    return model, (lambda x: model(pixel_values=x).last_hidden_state), torch.randn(1, 3, 32, 32)


def compiled_plan(fn, x, target: str):
    """The plan of `fn`'s forward graph, frozen: it takes `x` alone, as eager does."""
    records: list = []
    torch._dynamo.reset()
    options = {"target": target, "freeze": True, "fallback": "error"}
    with torch.no_grad(), recording(records):
        torch.compile(fn, backend="minicomp", options=options)(x)
    (record,) = records
    return record.plan


def new_constant_bytes(plan, model: torch.nn.Module) -> int:
    """Bytes of the plan's constants that are not the model's own memory (folded results):
    eager computes those during every call, the plan once before it.

    Convolution weights and biases with a batch norm folded in (fold_batch_norm.py) are left
    out: eager never computes them (it normalises the activation on every call instead), so
    they are memory the compiled function holds, as docs/freeze.md says, not a call's."""
    own = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    folded = ("_folded_weight", "_folded_bias")
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage()
        for k, t in plan.constants.items()
        if not plan.slots[k].name.endswith(folded)
    }
    return sum(s.nbytes() for ptr, s in storages.items() if ptr not in own)


@pytest.mark.parametrize("build", [gpt2, resnet], ids=["gpt2", "resnet"])
def test_plan_peak_is_at_most_eager_peak(build, target):
    model, fn, x = build()
    plan = compiled_plan(fn, x, target)
    eager = peak_bytes(fn, x)
    measured = peak_bytes(plan, x)
    stats = plan.memory_stats(x)
    # The plan's own account is what the call allocates.
    assert measured <= stats.peak
    assert stats.workspace + stats.outputs <= stats.peak
    # Counting what folding computed once as if it were allocated by every call.
    assert stats.peak + new_constant_bytes(plan, model) <= eager, (stats, eager)
    torch.testing.assert_close(plan(x)[0], fn(x), rtol=1e-4, atol=1e-4)
