"""Models under `torch.autocast`, compiled by minicomp: the graphs Dynamo captures hold the
casts autocast inserts, and the compiled model must be as close to float32 as eager autocast
is, with those casts fused into their neighbours on the CUDA targets."""

import copy
import os

import pytest
import torch
from helpers import compile_minicomp

import minicomp

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # configs are built here; nothing is downloaded
transformers = pytest.importorskip("transformers")

VOCAB = 128
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}


def gpt2(target: str, **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1, n_head=2, n_embd=64, vocab_size=VOCAB, n_positions=64,
        bos_token_id=0, eos_token_id=0, attn_implementation="sdpa",
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **overrides,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config).to(_device(target))


def tokens(target: str) -> torch.Tensor:
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    return ids.to(_device(target))


def _device(target: str) -> str:
    return "cuda" if target == "cuda" else "cpu"


def _loss(model, ids, dtype, target):
    with torch.autocast(_device(target), dtype=dtype):
        return model(input_ids=ids, labels=ids, use_cache=False).loss


def _relative_errors(model, reference) -> dict[str, float]:
    ref = dict(reference.named_parameters())
    return {
        name: ((p.grad - ref[name].grad).norm() / ref[name].grad.norm()).item()
        for name, p in model.named_parameters()
    }


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_gpt2_training_step_under_autocast(dtype, target):
    # Compiled autocast keeps some values in f32 that eager rounds to half (inside fused
    # kernels), so it need not match eager autocast bit for bit; it must be as close to the
    # float32 gradients as eager autocast is.
    if target == "cpu" and dtype == "f16":
        pytest.skip("f16 training on cpu: test_float16_training_under_a_gradient_scaler")
    dtype = DTYPES[dtype]
    model = gpt2(target)
    eager, reference = copy.deepcopy(model), copy.deepcopy(model)
    ids = tokens(target)

    _loss(eager, ids, dtype, target).backward()
    reference(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    step = compile_minicomp(lambda ids: _loss(model, ids, dtype, target), target)
    loss = step(ids)
    loss.backward()

    assert loss.dtype == torch.float32
    eager_err, compiled_err = _relative_errors(eager, reference), _relative_errors(model, reference)
    # 1e-2 (bf16) and 1e-3 (f16) are what eager autocast reaches here; a wrong cast or a
    # half-precision accumulation is off by far more.
    floor = {torch.float16: 2e-4, torch.bfloat16: 2e-3}[dtype]
    for name, err in compiled_err.items():
        bound = 2 * eager_err[name] + floor
        assert err <= bound, f"grad of {name}: {err:.2e}, eager autocast {eager_err[name]:.2e}"


CASTS = {"_to_copy", "convert_element_type"}


def _casts_only(members: tuple[str, ...]) -> bool:
    return bool(CASTS & set(members)) and set(members) <= CASTS | {"view", "permute", "expand"}


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_autocast_casts_fuse_into_their_neighbours(dtype, target):
    if target == "cpu":
        pytest.skip("on the cpu target half-precision GEMMs are ATen calls whose inputs are cast")
    model = gpt2(target).eval()

    def logits(ids):
        with torch.autocast(_device(target), dtype=DTYPES[dtype]):
            return model(input_ids=ids, use_cache=False).logits

    with torch.no_grad():
        report = minicomp.explain(logits, tokens(target), options={"target": target})
    # Every cast of a weight, bias or activation lands in the kernel that reads it (a matmul
    # template's operand loads or epilogue, a normalization) rather than a kernel of its own.
    alone = [name for name, members in report.fused_groups if _casts_only(members)]
    assert not alone, f"kernels that only cast: {alone}"


def test_float16_training_under_a_gradient_scaler(target):
    # A scale large enough that the first steps' f16 gradients overflow: the scaler must see
    # the same inf/NaN and skip the same steps, then both runs take the same updates.
    model = gpt2(target)
    eager = copy.deepcopy(model)
    ids = tokens(target)

    def trainer(m):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler(_device(target), init_scale=2.0**23, growth_interval=2)

        def step(forward):
            loss = _loss(forward, ids, torch.float16, target)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            return loss.detach(), scaler.get_scale()

        return step

    eager_step, compiled_step = trainer(eager), trainer(model)
    compiled = compile_minicomp(model, target)
    history = []
    for _ in range(8):
        (eager_loss, eager_scale), (loss, scale) = eager_step(eager), compiled_step(compiled)
        history.append(scale)
        assert scale == eager_scale, f"scales {history} differ from eager at {eager_scale}"
        torch.testing.assert_close(loss, eager_loss, rtol=2e-3, atol=2e-3)
    assert min(history) < 2.0**23 and history[-1] > min(history), f"no skip and regrowth: {history}"
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-3, msg=lambda m, n=name: f"{n}: {m}")
