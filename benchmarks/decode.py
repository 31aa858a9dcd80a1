"""Token generation with a LLaMA-shaped decoder (random weights): tokens per second and weight
memory for eager, Inductor and minicomp, in bf16/f16 and under torchao's quantizations.

    python benchmarks/decode.py --preset small --batch 1,8 --quant none,int8wo,int8dq,int4wo,fp8wo
    python benchmarks/decode.py --device cuda --preset 1b --dtype float16   # the GPU run

The model is gpt-fast's shape of decoder: RMSNorm, rotary embeddings, grouped-query attention
over a static KV cache (a buffer written in place at the step's position), a SwiGLU MLP. One
decode step takes one token per sequence at a position given as a tensor, so every step has
the same shapes and each backend compiles one graph. Each quantization is applied with
torchao's `quantize_` to every linear layer (the LM head included). A round generates
`--tokens` tokens with every backend in turn (the order rotating), greedily, after a prompt
fed one token at a time (not timed); a cell is tokens/s from the median round (CPU time on
the CPU, which other tenants of a shared machine do not inflate; wall time after a
synchronize on a GPU), and its ratio to eager's and Inductor's in the same round. Before
timing, every backend's logits for the prompt's last position are compared with eager's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass

import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn

import minicomp  # noqa: F401  (registers the "minicomp" backend)


@dataclass(frozen=True)
class Shape:
    dim: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    max_seq: int = 256


PRESETS = {
    # Small enough for a 2-core CPU: a few ms a token.
    "small": Shape(dim=512, layers=4, heads=8, kv_heads=2, ffn=1408, vocab=4096),
    # TinyLlama-1.1B's shape.
    "1b": Shape(dim=2048, layers=22, heads=32, kv_heads=4, ffn=5632, vocab=32000),
    # LLaMA-2 7B's shape (multi-head attention).
    "7b": Shape(dim=4096, layers=32, heads=32, kv_heads=32, ffn=11008, vocab=32000),
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return y.type_as(x) * self.weight


def rotate(x, cos, sin):
    """Rotary embedding of x [B, H, T, D] at angles cos/sin [T, D/2] (pairs interleaved)."""
    xf = x.float().unflatten(-1, (-1, 2))
    a, b = xf[..., 0], xf[..., 1]
    out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1)
    return out.flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, s: Shape, batch: int, dtype: torch.dtype):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = s.heads, s.kv_heads, s.dim // s.heads
        self.wq = nn.Linear(s.dim, s.dim, bias=False)
        self.wk = nn.Linear(s.dim, s.kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(s.dim, s.kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(s.dim, s.dim, bias=False)
        cache = (batch, s.kv_heads, s.max_seq, self.head_dim)
        self.register_buffer("k_cache", torch.zeros(cache, dtype=dtype), persistent=False)
        self.register_buffer("v_cache", torch.zeros(cache, dtype=dtype), persistent=False)

    def forward(self, x, pos, cos, sin, mask):
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        groups = self.heads // self.kv_heads
        keys = self.k_cache.repeat_interleave(groups, dim=1)
        values = self.v_cache.repeat_interleave(groups, dim=1)
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, s: Shape, batch: int, dtype: torch.dtype):
        super().__init__()
        self.attention_norm, self.ffn_norm = RMSNorm(s.dim), RMSNorm(s.dim)
        self.attention = Attention(s, batch, dtype)
        self.w1 = nn.Linear(s.dim, s.ffn, bias=False)
        self.w3 = nn.Linear(s.dim, s.ffn, bias=False)
        self.w2 = nn.Linear(s.ffn, s.dim, bias=False)

    def forward(self, x, pos, cos, sin, mask):
        h = x + self.attention(self.attention_norm(x), pos, cos, sin, mask)
        n = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(n)) * self.w3(n))


class Decoder(nn.Module):
    """A LLaMA-shaped decoder whose forward is one decode step: tokens [B, 1] at position
    `pos` ([1] int64) -> logits [B, vocab] (f32)."""

    def __init__(self, s: Shape, batch: int, dtype: torch.dtype):
        super().__init__()
        self.shape = s
        self.embed = nn.Embedding(s.vocab, s.dim)
        self.layers = nn.ModuleList(Block(s, batch, dtype) for _ in range(s.layers))
        self.norm = RMSNorm(s.dim)
        self.output = nn.Linear(s.dim, s.vocab, bias=False)
        half = s.dim // s.heads // 2
        freqs = 1.0 / (10000.0 ** (torch.arange(half).float() / half))
        angles = torch.outer(torch.arange(s.max_seq).float(), freqs)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        self.register_buffer("positions", torch.arange(s.max_seq), persistent=False)

    def forward(self, tokens, pos):
        x = self.embed(tokens)
        cos, sin = self.cos[pos], self.sin[pos]
        mask = (self.positions <= pos).view(1, 1, 1, -1)
        for layer in self.layers:
            x = layer(x, pos, cos, sin, mask)
        return self.output(self.norm(x))[:, -1].float()

    def reset(self) -> None:
        for layer in self.layers:
            layer.attention.k_cache.zero_()
            layer.attention.v_cache.zero_()


def quantization_config(name: str):
    """torchao's config for quantization `name`, None for none."""
    if name == "none":
        return None
    from torchao import quantization as q

    configs = {
        "int8wo": lambda: q.Int8WeightOnlyConfig(),
        "int8dq": lambda: q.Int8DynamicActivationInt8WeightConfig(),
        "int4wo": lambda: q.IntxWeightOnlyConfig(
            weight_dtype=torch.int4, granularity=q.PerGroup(32)
        ),
        "fp8wo": lambda: q.Float8WeightOnlyConfig(),
    }
    return configs[name]()


def build(preset: str, batch: int, dtype: torch.dtype, quant: str, device: str) -> Decoder:
    torch.manual_seed(0)
    model = Decoder(PRESETS[preset], batch, dtype)
    for p in model.parameters():
        p.data.normal_(0.0, 0.02)
    model = model.to(device=device, dtype=dtype).eval()
    config = quantization_config(quant)
    if config is not None:
        from torchao.quantization import quantize_

        quantize_(model, config)
    return model


def weight_bytes(model: nn.Module) -> int:
    """Bytes the parameters hold, counting a quantized tensor's stored data and scales."""
    total = 0
    for p in model.parameters():
        inner = getattr(p, "__tensor_flatten__", None)
        if inner is None:
            total += p.numel() * p.element_size()
            continue
        names, _ = p.__tensor_flatten__()
        total += sum(getattr(p, n).numel() * getattr(p, n).element_size() for n in names)
    return total


def step_fn(model: Decoder, backend: str):
    if backend == "eager":
        return model
    if backend == "inductor":
        return torch.compile(model, backend="inductor")
    target = "cuda" if next(model.parameters()).is_cuda else "cpu"
    return torch.compile(model, backend="minicomp", options={"target": target})


def generate(step, model: Decoder, prompt: torch.Tensor, tokens: int, timer) -> tuple:
    """Greedy generation after `prompt` [B, P]: (the new tokens [B, tokens], the seconds the
    decode steps took, the logits at the prompt's last position)."""
    model.reset()
    device = prompt.device
    logits = None
    for p in range(prompt.shape[1]):
        logits = step(prompt[:, p : p + 1], torch.tensor([p], device=device))
    out = [logits.argmax(-1)]
    start = timer()
    for k in range(tokens - 1):
        pos = torch.tensor([prompt.shape[1] + k], device=device)
        out.append(step(out[-1][:, None], pos).argmax(-1))
    if device.type == "cuda":
        torch.cuda.synchronize()
    return torch.stack(out, 1), timer() - start, logits.clone()


def measure(args, batch: int, quant: str, backends: list[str]) -> dict:
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    model = build(args.preset, batch, dtype, quant, args.device)
    gen = torch.Generator().manual_seed(batch)
    prompt = torch.randint(0, model.shape.vocab, (batch, args.prompt), generator=gen).to(device)
    timer = time.perf_counter if device.type == "cuda" else time.process_time
    rows: dict = {}
    steps = {}
    torch._dynamo.reset()
    with torch.no_grad():
        _, _, expected = generate(model, model, prompt, 1, timer)
        for backend in backends:
            step = step_fn(model, backend)
            start = time.perf_counter()
            _, _, logits = generate(step, model, prompt, 2, timer)
            first_s = time.perf_counter() - start
            err = float((logits - expected).abs().max())
            ok = bool(torch.allclose(logits, expected, rtol=5e-2, atol=5e-2))
            rows[backend] = {"first_s": round(first_s, 2), "max_err": err, "ok": ok}
            if ok:
                steps[backend] = step
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
                generate(step, model, prompt, 2, timer)
                rows[backend]["peak_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        seconds: dict = {b: [] for b in steps}
        order = list(steps)
        for r in range(args.rounds):
            for backend in order[r % len(order) :] + order[: r % len(order)]:
                _, s, _ = generate(steps[backend], model, prompt, args.tokens, timer)
                seconds[backend].append(s)
    new_tokens = batch * (args.tokens - 1)
    for backend, samples in seconds.items():
        rows[backend]["tokens_per_s"] = round(new_tokens / statistics.median(samples), 1)
        for base in ("eager", "inductor"):
            if base in seconds:
                ratios = [b / s for s, b in zip(samples, seconds[base])]
                rows[backend][f"vs_{base}"] = round(statistics.median(ratios), 3)
    return {"weight_mb": round(weight_bytes(model) / 2**20, 1), "backends": rows}


def print_table(results: dict, backends: list[str]) -> None:
    head = f"{'quant':<8}{'batch':>6}{'weights MB':>11}"
    print(head + "".join(f"{b + ' tok/s':>16}{'vs eager':>10}{'vs ind.':>9}" for b in backends))
    for (quant, batch), r in results.items():
        cells = []
        for b in backends:
            row = r["backends"].get(b, {})
            if not row.get("ok"):
                cells.append(f"{'FAIL':>16}{'':>10}{'':>9}")
                continue
            ve, vi = row.get("vs_eager"), row.get("vs_inductor")
            cells.append(
                f"{row['tokens_per_s']:>16.1f}"
                + (f"{ve:>9.2f}x" if ve else f"{'':>10}")
                + (f"{vi:>8.2f}x" if vi else f"{'':>9}")
            )
        print(f"{quant:<8}{batch:>6}{r['weight_mb']:>11.1f}" + "".join(cells))


def commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small", choices=list(PRESETS))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--batch", default="1,8", help="comma list")
    parser.add_argument("--quant", default="none,int8wo,int8dq,int4wo,fp8wo", help="comma list")
    parser.add_argument("--backends", default="eager,inductor,minicomp", help="comma list")
    parser.add_argument("--prompt", type=int, default=8, help="prompt tokens (fed, not timed)")
    parser.add_argument("--tokens", type=int, default=32, help="tokens generated per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (CPU runs)")
    parser.add_argument("--save", help="write the results as JSON to this path")
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    backends = [b for b in args.backends.split(",") if b]
    results = {}
    for quant in args.quant.split(","):
        for batch in (int(b) for b in args.batch.split(",")):
            results[(quant, batch)] = measure(args, batch, quant, backends)
            print(f"measured {quant} batch {batch}", flush=True)
    device = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor()
    print(
        f"{args.preset} decoder, {args.dtype}, {args.device} ({device}), torch {torch.__version__},"
        f" {args.tokens} tokens x {args.rounds} rounds, commit {commit()}"
    )
    print_table(results, backends)
    if args.save:
        record = {
            "date": datetime.date.today().isoformat(), "commit": commit(),
            "torch": torch.__version__, "device": device, "args": vars(args),
            "results": [{"quant": q, "batch": b, **r} for (q, b), r in results.items()],
        }  # fmt: skip
        os.makedirs(os.path.dirname(os.path.abspath(args.save)), exist_ok=True)
        with open(args.save, "w") as f:
            json.dump(record, f, indent=2)
        print("saved", args.save)


if __name__ == "__main__":
    main()
