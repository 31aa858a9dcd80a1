"""The Hopper templates on a Hopper GPU, compiled for the device (sm_90a): every matmul config
the tuner offers (clusters sharing a tile by TMA multicast included), and the attention
forward and backward of a compiled training step, each against float64. The emulator tests
(test_matmul_hopper.py, test_attention_hopper*.py) check the same kernels on the CPU; these
check that the hardware agrees. They need an sm_90 GPU: `pytest -m gpu`, or the staged GPU
run's check stage."""

import pytest
import torch

from minicomp.dynamo.backend import recording
from minicomp.schedule.templates import attention_hopper, attention_hopper_bwd, matmul_hopper
from minicomp.schedule.templates.matmul_hopper import offered_configs


def _hopper_gpu() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _hopper_gpu(), reason="needs an sm_90 (Hopper) GPU"),
]
SMS = 132  # the configs an H100 is offered


@pytest.mark.parametrize("config", offered_configs(SMS), ids=lambda c: c.name)
def test_every_matmul_config_matches_float64(config):
    # Ragged M, N and K: edge tiles, a cluster whose second tile lies past C, a partial stage.
    m, n, k = 333, 520, 200
    a = torch.randn(m, k, device="cuda").half()
    b = torch.randn(n, k, device="cuda").half()
    out = torch.full((m, n), float("nan"), device="cuda")
    matmul_hopper.matmul_hopper(a, b, out, config=config)
    torch.cuda.synchronize()
    expected = a.double() @ b.double().T
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-3)


def attention_step(q, k, v, qg, kg, vg):
    sdpa = torch.nn.functional.scaled_dot_product_attention
    causal = sdpa(q, k, v, is_causal=True)
    grouped = sdpa(qg, kg, vg, enable_gqa=True)
    return causal, grouped


def step_inputs():
    shapes = [(2, 4, 200, 64), (2, 4, 300, 64), (2, 4, 300, 64)]  # causal, d 64
    shapes += [(1, 8, 130, 128), (1, 2, 257, 128), (1, 2, 257, 128)]  # grouped, d 128
    return [torch.randn(s, device="cuda", dtype=torch.bfloat16, requires_grad=True) for s in shapes]


def test_a_compiled_attention_training_step_runs_the_hopper_templates():
    torch._dynamo.reset()
    fn = torch.compile(attention_step, backend="minicomp", options={"fallback": "error"})
    args = step_inputs()
    records: list = []
    with recording(records):
        outs = fn(*args)
        grads = [torch.randn_like(o) for o in outs]
        torch.autograd.backward(outs, grads)
    used = {k.attrs.template.split("[")[0] for r in records for k in r.kernels if k.attrs.template}
    assert attention_hopper.NAME in used and attention_hopper_bwd.NAME in used, used
    ref = [t.detach().double().requires_grad_() for t in args]
    expected = attention_step(*ref)
    for out, want in zip(outs, expected):
        torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=2e-2)
    torch.autograd.backward(expected, [g.double() for g in grads])
    for t, r in zip(args, ref):
        torch.testing.assert_close(t.grad.double(), r.grad, rtol=3e-2, atol=3e-2)
