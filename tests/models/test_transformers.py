"""Tiny random-weight `transformers` models compiled by minicomp and compared with eager."""

import copy
import os

import pytest
import torch
from helpers import assert_same, check_compiled, compile_minicomp

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # configs are built here; nothing is downloaded
transformers = pytest.importorskip("transformers")

# Whole models chain dozens of matmuls and normalizations, each summed in its own order.
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
VOCAB = 128


def tokens(batch: int, seq: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(1))


def gpt2_config(attn_implementation: str = "eager", **overrides):
    return transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=64, vocab_size=VOCAB, n_positions=64,
        bos_token_id=0, eos_token_id=0, attn_implementation=attn_implementation, **overrides,
    )  # fmt: skip


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_gpt2_logits(attn_implementation, target):
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(gpt2_config(attn_implementation)).eval()

    def logits(input_ids):
        return model(input_ids=input_ids, use_cache=False).logits

    with torch.no_grad():
        check_compiled(logits, tokens(2, 16), target=target, **TOLERANCE)


def test_bert_hidden_states(target):
    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        vocab_size=VOCAB, max_position_embeddings=64, pad_token_id=0,
    )  # fmt: skip
    model = transformers.BertModel(config).eval()
    attention_mask = torch.ones(2, 16, dtype=torch.long)
    attention_mask[1, 10:] = 0  # the second sequence is padded

    def encode(input_ids, attention_mask):
        out = model(input_ids=input_ids, attention_mask=attention_mask)
        return out.last_hidden_state, out.pooler_output

    with torch.no_grad():
        check_compiled(encode, tokens(2, 16), attention_mask, target=target, **TOLERANCE)


def test_llama_logits(target):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=64,
        bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()

    def logits(input_ids):
        return model(input_ids=input_ids, use_cache=False).logits

    with torch.no_grad():
        check_compiled(logits, tokens(2, 16), target=target, **TOLERANCE)


def test_resnet_features(target):
    torch.manual_seed(0)
    config = transformers.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1])
    model = transformers.ResNetModel(config).eval()

    def features(pixel_values):
        out = model(pixel_values=pixel_values)
        return out.last_hidden_state, out.pooler_output

    with torch.no_grad():
        check_compiled(features, torch.randn(1, 3, 32, 32), target=target, **TOLERANCE)


def check_gradients(model: torch.nn.Module, loss_fn, *inputs, target: str) -> None:
    """Backpropagate `loss_fn(model, *inputs)` eagerly and compiled; losses and grads must match."""
    eager_model = copy.deepcopy(model)
    expected_loss = loss_fn(eager_model, *inputs)
    expected_loss.backward()
    loss = loss_fn(compile_minicomp(model, target), *inputs)
    loss.backward()
    assert_same(loss.detach(), expected_loss.detach(), **TOLERANCE)
    eager_params = dict(eager_model.named_parameters())
    for name, param in model.named_parameters():
        assert param.grad is not None, f"no gradient for {name}"
        torch.testing.assert_close(
            param.grad, eager_params[name].grad, msg=lambda m, n=name: f"grad of {n}: {m}",
            **TOLERANCE,
        )  # fmt: skip


def test_mlp_training_gradients(target):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64), torch.nn.Linear(64, 10)
    )
    x, labels = torch.randn(8, 32), torch.randint(0, 10, (8,))

    def loss_fn(m, x, labels):
        return torch.nn.functional.cross_entropy(m(x), labels)

    check_gradients(model, loss_fn, x, labels, target=target)


def test_gpt2_training_gradients(target):
    torch.manual_seed(0)
    config = gpt2_config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # deterministic
    model = transformers.GPT2LMHeadModel(config).train()

    def loss_fn(m, input_ids):
        return m(input_ids=input_ids, labels=input_ids, use_cache=False).loss

    check_gradients(model, loss_fn, tokens(2, 16), target=target)


# float16 on the CUDA targets: tensor-core matmul templates and the fused attention kernel
# accumulate in f32 and round once, where eager rounds every op's result to f16, so outputs
# differ by a few f16 roundings (one is 4.9e-4 relative; 1 ulp is what these configs show).
# 1e-2 leaves about 20 roundings at the largest output while a real bug (a wrong mask, scale
# or cast) is off by 1e-1 or more.
F16_TOLERANCE = {"rtol": 1e-2, "atol": 1e-2}


def _skip_cpu_target(target):
    if target == "cpu":
        pytest.skip("the float16 model tests check the CUDA targets' half-precision paths")


def test_gpt2_logits_float16(target):
    _skip_cpu_target(target)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(gpt2_config("sdpa")).eval().half()

    def logits(input_ids):
        return model(input_ids=input_ids, use_cache=False).logits

    with torch.no_grad():
        out = check_compiled(logits, tokens(2, 16), target=target, **F16_TOLERANCE)
    assert out.dtype == torch.float16


def test_bert_hidden_states_float16(target):
    _skip_cpu_target(target)
    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        vocab_size=VOCAB, max_position_embeddings=64, pad_token_id=0,
        attn_implementation="sdpa",
    )  # fmt: skip
    model = transformers.BertModel(config).eval().half()
    attention_mask = torch.ones(2, 16, dtype=torch.long)
    attention_mask[1, 10:] = 0  # the second sequence is padded

    def encode(input_ids, attention_mask):
        out = model(input_ids=input_ids, attention_mask=attention_mask)
        return out.last_hidden_state, out.pooler_output

    with torch.no_grad():
        hidden, pooled = check_compiled(
            encode, tokens(2, 16), attention_mask, target=target, **F16_TOLERANCE
        )
    assert hidden.dtype == pooled.dtype == torch.float16
