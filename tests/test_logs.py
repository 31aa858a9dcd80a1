"""minicomp's names in PyTorch's logging: TORCH_LOGS accepts them in a fresh interpreter that
never imports minicomp (the `torch.backends` entry point), and warnings name the user's line."""

import logging
import sys
import warnings

import torch
import torch._logging._internal as torch_logs
from helpers_python import run_python

from minicomp import logs


def test_torch_logs_prints_the_source_without_importing_minicomp(tmp_path):
    code = (
        "import sys, torch\n"
        "assert 'minicomp' not in sys.modules  # only minicomp/logs.py was loaded\n"
        "f = torch.compile(lambda x: (x.sin() + 1).relu(), backend='minicomp')\n"
        "f(torch.randn(8))\n"
    )
    proc = run_python(code, tmp_path, TORCH_LOGS="minicomp_source")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[__minicomp_source]" in proc.stderr
    assert "void k0_sin_add_relu(" in proc.stderr
    # The runtime header, the same in every graph, is named instead of printed.
    assert "runtime.h, minicomp's runtime header" in proc.stderr
    assert proc.stderr.count("#include") < 5, "the runtime header was printed"
    assert "[__minicomp_fusion]" not in proc.stderr, "only the artifacts named"


def test_torch_logs_help_lists_the_artifacts(tmp_path):
    proc = run_python("import torch", tmp_path, TORCH_LOGS="+help")
    for name in logs.ARTIFACTS:
        assert name in proc.stderr


def test_names_registered_in_this_process():
    # Registered when minicomp was imported; torch gave the logger its handler.
    assert torch_logs.log_registry.is_log("minicomp")
    assert all(torch_logs.log_registry.is_artifact(name) for name in logs.ARTIFACTS)
    handlers = logging.getLogger("minicomp").handlers
    assert any(h in torch_logs.handlers for h in handlers)
    logs.register()  # again: nothing changes
    assert logging.getLogger("minicomp").handlers == handlers


def test_set_logs_turns_an_artifact_on():
    assert not logs.artifact_on("minicomp_fusion")
    torch._logging.set_logs(modules={"minicomp_fusion": True})
    try:
        assert logs.artifact_on("minicomp_fusion")
    finally:
        torch._logging.set_logs()
    assert not logs.artifact_on("minicomp_fusion")


def test_warn_user_called_from_user_code_names_its_line():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logs.warn_user("here", UserWarning)
        line = sys._getframe().f_lineno - 1
    (w,) = caught
    assert (w.filename, w.lineno) == (__file__, line)
