"""benchmarks/decode.py's decoder: one step at a time over its static KV cache, it gives the
logits a whole-sequence forward without a cache gives, and minicomp's compiled step generates
eager's tokens (the cache written in place through the compiled graph's mutation)."""

import importlib.util
import os
import sys

import pytest
import torch
import torch.nn.functional as F
from helpers import compile_minicomp

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _decode_module():
    spec = importlib.util.spec_from_file_location(
        "decode_benchmark", os.path.join(REPO, "benchmarks", "decode.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


decode = _decode_module()
TINY = decode.Shape(dim=64, layers=2, heads=4, kv_heads=2, ffn=96, vocab=97, max_seq=16)


def _model(batch: int) -> "decode.Decoder":
    torch.manual_seed(0)
    model = decode.Decoder(TINY, batch, torch.float32)
    for p in model.parameters():
        p.data.normal_(0.0, 0.2)
    return model.eval()


def _full_sequence_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    """The last position's logits of a causal forward over all of `tokens` at once, no cache."""
    s = model.shape
    t = tokens.shape[1]
    x = model.embed(tokens)
    cos, sin = model.cos[:t], model.sin[:t]
    for layer in model.layers:
        a = layer.attention
        h = layer.attention_norm(x)
        q = a.wq(h).view(-1, t, a.heads, a.head_dim).transpose(1, 2)
        k = a.wk(h).view(-1, t, a.kv_heads, a.head_dim).transpose(1, 2)
        v = a.wv(h).view(-1, t, a.kv_heads, a.head_dim).transpose(1, 2)
        q, k = decode.rotate(q, cos, sin), decode.rotate(k, cos, sin)
        groups = s.heads // s.kv_heads
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + a.wo(y.transpose(1, 2).reshape(-1, t, s.dim))
        n = layer.ffn_norm(x)
        x = x + layer.w2(F.silu(layer.w1(n)) * layer.w3(n))
    return model.output(model.norm(x))[:, -1].float()


def test_a_step_over_the_cache_gives_the_full_sequence_logits():
    model = _model(batch=2)
    tokens = torch.randint(0, TINY.vocab, (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model.reset()
        for p in range(tokens.shape[1]):
            logits = model(tokens[:, p : p + 1], torch.tensor([p]))
        expected = _full_sequence_logits(model, tokens)
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch", [1, 3])
def test_minicomp_generates_eager_tokens(batch):
    model = _model(batch)
    prompt = torch.randint(0, TINY.vocab, (batch, 3), generator=torch.Generator().manual_seed(2))
    timer = torch.get_num_threads  # not timed here; any callable returning a number
    with torch.no_grad():
        want, _, want_logits = decode.generate(model, model, prompt, 6, timer)
        step = compile_minicomp(model, "cpu")
        got, _, got_logits = decode.generate(step, model, prompt, 6, timer)
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-4, atol=1e-4)
    assert torch.equal(got, want)
