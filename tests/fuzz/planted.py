"""Compilers with planted bugs, for testing the fuzzer's shrinker, session and worker."""

import ctypes
import time

import torch
from torch.overrides import TorchFunctionMode

_MULS = {torch.mul, torch.Tensor.mul, torch.Tensor.__mul__, torch.Tensor.__rmul__}


class _MiscomputeMul(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out + 1 if func in _MULS else out


def miscompute_mul(fn, target, dynamic):
    """Runs fn eagerly, except that every multiplication comes out 1 too high."""

    def run(*args):
        with _MiscomputeMul():
            return fn(*args)

    return run


class _Watch(TorchFunctionMode):
    def __init__(self, func, action):
        super().__init__()
        self.func, self.action = func, action

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is self.func:
            self.action()
        return func(*args, **(kwargs or {}))


def _watching(func, action):
    def compile_(fn, target, dynamic):
        def run(*args):
            with _Watch(func, action):
                return fn(*args)

        return run

    return compile_


def _refuse():
    raise NotImplementedError("no lowering for aten.exp")


def _segfault():
    ctypes.string_at(0)


# Raises on every torch.exp, as a compiler with no lowering for it would.
refuse_exp = _watching(torch.exp, _refuse)
# Kills the process on every torch.exp.
segfault_on_exp = _watching(torch.exp, _segfault)
# Never finishes a program with torch.exp.
hang_on_exp = _watching(torch.exp, lambda: time.sleep(3600))
