"""minicomp: a deep-learning compiler for torch.compile.

`torch.compile(model, backend="minicomp")` finds the backend through the
`torch_dynamo_backends` entry point; importing minicomp is only needed for its API.
"""

from minicomp import config, script
from minicomp.dynamo.backend import FallbackWarning, KernelFallbackWarning
from minicomp.explain import Explanation, explain, explain_file

__all__ = [
    "config",
    "explain",
    "explain_file",
    "Explanation",
    "FallbackWarning",
    "KernelFallbackWarning",
    "script",
]
