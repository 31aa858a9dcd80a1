"""Every CUDA kernel the compiler generates for real models and ops compiles with NVRTC.

The graphs are compiled for the cuda-emu target (which runs them here and checks the
results against eager); the same CUDA source then goes through NVRTC for sm_80 and sm_90
(and sm_89 for the float8 kernels, the first architecture with float8 hardware), and
ptxas's report of registers, shared memory and spills is printed. No kernel of the
auto-scheduler may spill or keep a stack frame."""

import pytest
import torch

import minicomp

nvrtc = pytest.importorskip("minicomp.backends.cuda.nvrtc")

ARCHS = ("sm_80", "sm_90")
FLOAT8_ARCHS = ("sm_80", "sm_89", "sm_90")


def _tiny_models():
    from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_head=2, n_embd=64, vocab_size=128, n_positions=32)
    ).eval()
    bert = BertModel(
        BertConfig(
            hidden_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=128,
            vocab_size=128,
            max_position_embeddings=32,
        )
    ).eval()
    ids = torch.randint(0, 128, (2, 16))
    return [("gpt2", gpt2, (ids,)), ("bert", bert, (ids,))]


def _ops():
    x = torch.randn(6, 300)
    h = torch.randn(4, 2048).half()
    b = torch.randn(3, 70).bfloat16()
    v = torch.randn(16, 256)
    r = torch.randn(256)
    return [
        # Vectorised elementwise kernels (16-byte accesses; 32-byte loads of f32 under f16).
        ("vec_f32", lambda v, r: torch.nn.functional.silu(v * r) + 1, (v, r)),
        ("vec_f16_out", lambda v, h: v.sigmoid().half() * h, (v, v.half())),
        ("vec_bf16", lambda b: torch.nn.functional.gelu(b) * 2, (v.bfloat16(),)),
        ("vec_f64", lambda d: torch.exp(d) - d * d, (v.double(),)),
        ("vec_bool", lambda v, r: (v > r) | (v < -1), (v, r)),
        ("softmax", lambda x: torch.softmax(x * 0.5, -1), (x,)),
        ("log_softmax", lambda x: torch.log_softmax(x, 0), (x,)),
        ("layer_norm", lambda x: torch.nn.functional.layer_norm(x, (300,)), (x,)),
        ("argmax_var", lambda x: (x.argmax(1), x.var(1), x.amin(0)), (x,)),
        ("any_all", lambda x: ((x > 0).any(1), (x > -3).all(0)), (x,)),
        ("full_sum", lambda x: x.sum(), (x,)),
        ("f16_gelu", lambda h: torch.nn.functional.gelu(h * 2, approximate="tanh"), (h,)),
        (
            "f16_rms",
            lambda h: h * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-6),
            (h,),
        ),
        ("bf16_mean", lambda b: b.mean(1), (b,)),
        (
            "gather_cat",
            lambda x: torch.cat([x[:, ::2], x.flip(1)], 1).gather(
                1, torch.arange(0, 300, 7).expand(6, -1)
            ),
            (x,),
        ),
    ]


def _float8_ops():
    e4m3 = torch.float8_e4m3fn

    def quantize(x):
        amax = x.abs().max()
        scale = 448.0 / amax.clamp(min=1e-12)
        return (x * scale).clamp(-448.0, 448.0).to(e4m3), scale

    def rows(x):
        scale = 448.0 / x.abs().amax(-1, keepdim=True).float().clamp(min=1e-12)
        return (x.float() * scale).clamp(-448.0, 448.0).to(e4m3), scale.reciprocal()

    x = torch.randn(64, 512)
    q, scale = quantize(x)
    return [
        ("f8_quantize", quantize, (x,)),
        ("f8_rows", rows, (x.bfloat16(),)),
        ("f8_dequantize", lambda q, s: (q.float() / s).half(), (q, scale)),
        ("f8_chain", lambda x: x.to(torch.float8_e5m2).to(e4m3).to(torch.bfloat16), (x,)),
        ("f8_transpose", lambda q: q.t().contiguous(), (q,)),
    ]


CASES = _ops() + _float8_ops() + _tiny_models()


@pytest.mark.parametrize("name, fn, args", CASES, ids=[c[0] for c in CASES])
def test_generated_kernels_compile_for_every_arch_without_spills(name, fn, args, tmp_path):
    with torch.no_grad():
        report = minicomp.explain(fn, *args, options={"target": "cuda-emu", "fallback": "error"})
    sources = [r.source for r in report.records if r.source]
    assert sources and report.kernel_count > 0
    if name.startswith("vec_"):
        assert any("mc_store_vec" in s for s in sources), "no vectorised kernel"
    lines = []
    for source in sources:
        for arch in FLOAT8_ARCHS if name.startswith("f8_") else ARCHS:
            binary = nvrtc.compile_cuda(source, arch=arch, cache_dir=str(tmp_path))
            for kernel, res in sorted(binary.resources.items()):
                lines.append(
                    f"{name:12s} {arch} {kernel:40s} regs {res.registers:3d} "
                    f"smem {res.shared_bytes:5d} spills {res.spill_stores}/{res.spill_loads}"
                )
                assert res.spill_stores == 0 and res.spill_loads == 0, lines[-1]
                # No stack frame: local arrays (vector registers) stay in registers.
                assert res.stack_bytes == 0, lines[-1]
    print("\n" + "\n".join(lines))
