"""The model suite: standard architectures built from installed packages with random weights.

Every model is built from a package's own classes and configs, never downloaded: "full" is
the standard configuration (transformers' default configs are the published ones: ResNetConfig
is ResNet-50, BertConfig BERT-base, GPT2Config GPT-2 124M, ViTConfig ViT-B/16), "small" is the
same architecture with two layers, narrow widths and small images, built in well under a
second, for tests. A builder returns the model (an `nn.Module` returning one tensor) and its
example inputs on the device, in the dtype asked for.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from minicomp.bench.options import SIZES

# Configs are built here; nothing may be fetched from a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TEXT_SEQ = {"full": 128, "small": 32}
SMALL_VOCAB = 512


@dataclass(frozen=True)
class Built:
    """A model ready to run: `model(*inputs)` returns one tensor."""

    model: torch.nn.Module
    inputs: tuple
    shape: dict  # what the inputs are: {"seq": 128} or {"image": 224}


@dataclass(frozen=True)
class ModelSpec:
    """One suite model: its name, family, the packages it needs and its builder."""

    name: str
    family: str  # vision, text-encoder or text-decoder
    description: str
    builder: Callable[[str, torch.dtype, int, str], Built]
    requires: tuple[str, ...] = ("transformers",)

    def missing(self) -> str | None:
        """Why this model cannot be built here (a package is not importable), or None."""
        absent = [name for name in self.requires if importlib.util.find_spec(name) is None]
        return f"needs {', '.join(absent)}, which is not installed" if absent else None

    def build(self, size: str, dtype: torch.dtype, batch: int, device: str) -> Built:
        """The model and inputs at `size` ("small" or "full"), reproducibly seeded."""
        if size not in SIZES:
            raise ValueError(f"unknown size {size!r}; expected one of {SIZES}")
        torch.manual_seed(0)
        return self.builder(size, dtype, batch, device)


class OutputOf(torch.nn.Module):
    """A transformers model called with positional tensors, returning one output field."""

    def __init__(self, model: torch.nn.Module, arg_names: tuple[str, ...], field: str, **extra):
        super().__init__()
        self.model = model
        self.arg_names = arg_names
        self.field = field
        self.extra = extra

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        out = self.model(**dict(zip(self.arg_names, args)), **self.extra)
        return getattr(out, self.field)


def _place(model: torch.nn.Module, dtype: torch.dtype, device: str) -> torch.nn.Module:
    return model.to(device=device, dtype=dtype).eval()


def _construct(cls, config, device: str) -> torch.nn.Module:
    # Built directly on the device: a 1B-parameter model initialises in seconds on a GPU.
    with torch.device(device):
        return cls(config)


def _tokens(batch: int, seq: int, vocab: int, device: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab, (batch, seq), generator=generator).to(device)


def _images(batch: int, size: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(batch, 3, size, size, generator=generator).to(device=device, dtype=dtype)


def _transformers():
    import transformers  # optional: the models that need it say so when it is missing

    return transformers


# -- vision --------------------------------------------------------------------------------


def _resnet50(size: str, dtype: torch.dtype, batch: int, device: str) -> Built:
    tf = _transformers()
    if size == "full":
        config, image = tf.ResNetConfig(num_labels=1000), 224  # ResNet-50
    else:
        config = tf.ResNetConfig(
            embedding_size=16, hidden_sizes=[32, 64], depths=[1, 1], num_labels=10
        )
        image = 32
    model = _construct(tf.ResNetForImageClassification, config, device)
    wrapped = _place(OutputOf(model, ("pixel_values",), "logits"), dtype, device)
    return Built(wrapped, (_images(batch, image, dtype, device),), {"image": image})


def _vit_b16(size: str, dtype: torch.dtype, batch: int, device: str) -> Built:
    tf = _transformers()
    if size == "full":
        config = tf.ViTConfig(num_labels=1000, attn_implementation="sdpa")  # ViT-B/16, 224
    else:
        config = tf.ViTConfig(
            image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
            num_attention_heads=2, intermediate_size=128, num_labels=10,
            attn_implementation="sdpa",
        )  # fmt: skip
    model = _construct(tf.ViTForImageClassification, config, device)
    wrapped = _place(OutputOf(model, ("pixel_values",), "logits"), dtype, device)
    image = config.image_size
    return Built(wrapped, (_images(batch, image, dtype, device),), {"image": image})


def _resnet50_tv(size: str, dtype: torch.dtype, batch: int, device: str) -> Built:
    from torchvision.models import resnet  # optional, as transformers

    with torch.device(device):
        if size == "full":
            model, image = resnet.resnet50(weights=None), 224
        else:
            model, image = resnet.ResNet(resnet.Bottleneck, [1, 1, 1, 1], num_classes=10), 32
    return Built(
        _place(model, dtype, device), (_images(batch, image, dtype, device),), {"image": image}
    )


# -- text ----------------------------------------------------------------------------------


def _bert_base(size: str, dtype: torch.dtype, batch: int, device: str) -> Built:
    tf = _transformers()
    if size == "full":
        config = tf.BertConfig(attn_implementation="sdpa")  # BERT-base
    else:
        config = tf.BertConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
            vocab_size=SMALL_VOCAB, max_position_embeddings=128, attn_implementation="sdpa",
        )  # fmt: skip
    model = _construct(tf.BertModel, config, device)
    names = ("input_ids", "attention_mask")
    wrapped = _place(OutputOf(model, names, "last_hidden_state"), dtype, device)
    seq = TEXT_SEQ[size]
    ids = _tokens(batch, seq, config.vocab_size, device)
    return Built(wrapped, (ids, torch.ones_like(ids)), {"seq": seq})


def _gpt2(size: str, dtype: torch.dtype, batch: int, device: str) -> Built:
    tf = _transformers()
    if size == "full":
        config = tf.GPT2Config(attn_implementation="sdpa")  # GPT-2 124M
    else:
        config = tf.GPT2Config(
            n_layer=2, n_head=2, n_embd=64, vocab_size=SMALL_VOCAB, n_positions=128,
            bos_token_id=0, eos_token_id=0, attn_implementation="sdpa",
        )  # fmt: skip
    model = _construct(tf.GPT2LMHeadModel, config, device)
    wrapped = _place(OutputOf(model, ("input_ids",), "logits", use_cache=False), dtype, device)
    seq = TEXT_SEQ[size]
    return Built(wrapped, (_tokens(batch, seq, config.vocab_size, device),), {"seq": seq})


def _llama_1b(size: str, dtype: torch.dtype, batch: int, device: str) -> Built:
    tf = _transformers()
    if size == "full":
        # TinyLlama-1.1B's shape: a LLaMA-2 decoder with grouped-query attention.
        config = tf.LlamaConfig(
            hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
            num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
            max_position_embeddings=2048, rms_norm_eps=1e-5, attn_implementation="sdpa",
        )  # fmt: skip
    else:
        config = tf.LlamaConfig(
            hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=SMALL_VOCAB, max_position_embeddings=128,
            attn_implementation="sdpa",
        )  # fmt: skip
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(config, name, 0)
    model = _construct(tf.LlamaForCausalLM, config, device)
    wrapped = _place(OutputOf(model, ("input_ids",), "logits", use_cache=False), dtype, device)
    seq = TEXT_SEQ[size]
    return Built(wrapped, (_tokens(batch, seq, config.vocab_size, device),), {"seq": seq})


def _t5_encoder(size: str, dtype: torch.dtype, batch: int, device: str) -> Built:
    tf = _transformers()
    if size == "full":
        # t5-base (T5Config's defaults are t5-small's).
        config = tf.T5Config(d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_heads=12)
    else:
        config = tf.T5Config(
            d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, vocab_size=SMALL_VOCAB
        )
    model = _construct(tf.T5EncoderModel, config, device)
    names = ("input_ids", "attention_mask")
    wrapped = _place(OutputOf(model, names, "last_hidden_state"), dtype, device)
    seq = TEXT_SEQ[size]
    ids = _tokens(batch, seq, config.vocab_size, device)
    return Built(wrapped, (ids, torch.ones_like(ids)), {"seq": seq})


SUITE: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("resnet50", "vision", "ResNet-50 (transformers), 224x224", _resnet50),
        ModelSpec("bert-base", "text-encoder", "BERT-base, sequence 128", _bert_base),
        ModelSpec("gpt2", "text-decoder", "GPT-2 124M with its LM head, sequence 128", _gpt2),
        ModelSpec(
            "llama-1b",
            "text-decoder",
            "LLaMA decoder, 1.1B (TinyLlama's shape), sequence 128",
            _llama_1b,
        ),
        ModelSpec("vit-b16", "vision", "ViT-B/16, 224x224", _vit_b16),
        ModelSpec("t5-encoder", "text-encoder", "T5-base encoder, sequence 128", _t5_encoder),
        ModelSpec(
            "resnet50-tv",
            "vision",
            "torchvision's ResNet-50, 224x224",
            _resnet50_tv,
            requires=("torchvision",),
        ),
    )
}


def model_names() -> list[str]:
    """Every suite model's name, in suite order."""
    return list(SUITE)


def get(name: str) -> ModelSpec:
    """The suite model called `name`; raises KeyError naming the known ones."""
    try:
        return SUITE[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; the suite has {', '.join(SUITE)}") from None
