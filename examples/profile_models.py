"""A GPT-2 block and a ResNet-50 stage for `minicomp profile` (random weights, float32, CPU):

    minicomp profile examples/profile_models.py gpt2      # one GPT-2 block, 128 tokens
    minicomp profile examples/profile_models.py resnet    # ResNet-50's first stage, 56 x 56

Run as a plain script, it compiles the model for the CPU and checks it against eager.
"""

from __future__ import annotations

import os
import sys

import torch


def gpt2_block() -> tuple[torch.nn.Module, torch.Tensor]:
    """GPT-2 small's first transformer block and 128 tokens of hidden states."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    config = transformers.GPT2Config(n_layer=1, attn_implementation="eager")
    block = transformers.GPT2LMHeadModel(config).transformer.h[0]

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = block

        def forward(self, x):
            return self.block(x)[0]

    return Block(), torch.randn(1, 128, config.n_embd)


def resnet_stage() -> tuple[torch.nn.Module, torch.Tensor]:
    """ResNet-50's first stage (three bottlenecks, 64 -> 256 channels) on a 56 x 56 map."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    model = transformers.ResNetModel(transformers.ResNetConfig())
    return model.encoder.stages[0], torch.randn(1, 64, 56, 56)


def main() -> None:
    which = sys.argv[1] if len(sys.argv) > 1 else "gpt2"
    torch.manual_seed(0)
    model, x = {"gpt2": gpt2_block, "resnet": resnet_stage}[which]()
    model.eval()
    with torch.no_grad():
        out = torch.compile(model, backend="minicomp")(x)
        torch.testing.assert_close(out, model(x), rtol=1e-3, atol=1e-3)
    print(f"{which}: minicomp matches eager")


if __name__ == "__main__":
    main()
