"""minicomp: a deep-learning compiler for torch.compile.

`torch.compile(model, backend="minicomp")` finds the backend through the
`torch_dynamo_backends` entry point, and `TORCH_LOGS=minicomp_source` (minicomp/logs.py) through
a `torch.backends` one; importing minicomp is only needed for its API.
"""

from minicomp import config, logs, script
from minicomp.dynamo.backend import FallbackWarning, KernelFallbackWarning
from minicomp.dynamo.ddp import DistributedWarning
from minicomp.dynamo.fsdp import compile_builtin_fsdp_modules
from minicomp.explain import Explanation, explain, explain_file

logs.register()  # where no entry point did while torch was imported (minicomp/logs.py)

__all__ = [
    "compile_builtin_fsdp_modules",
    "config",
    "DistributedWarning",
    "explain",
    "explain_file",
    "Explanation",
    "FallbackWarning",
    "KernelFallbackWarning",
    "script",
]
