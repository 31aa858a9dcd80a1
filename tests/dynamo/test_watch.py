"""dynamo/watch.py: the graph breaks, frames and recompiles Dynamo records during a run, read
back whatever the backend (here Dynamo's own "eager")."""

import inspect

import torch

from minicomp.dynamo.watch import function_name, headline, hint, watching


def _line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(k for k, line in enumerate(lines) if text in line)


def _helper(y):
    torch._dynamo.graph_break()
    return y * 3


def _breaks_twice(x):
    y = x.sin()
    print("first break")
    return _helper(y) + 1


def _breaks_in_a_loop(x):
    for i in range(2):
        print(i)
        x = x + 1
    return x


def test_graph_breaks_are_where_the_user_wrote_them_once_each():
    torch._dynamo.reset()
    compiled = torch.compile(_breaks_twice, backend="eager")
    with watching() as run:
        compiled(torch.randn(4))
        compiled(torch.randn(4))  # no new compile, no new break
    torch._dynamo.reset()
    where = {(b.lineno, b.function, b.line) for b in run.graph_breaks}
    assert where == {
        (_line_of(_breaks_twice, "print("), "_breaks_twice", 'print("first break")'),
        (_line_of(_helper, "graph_break()"), "_helper", "torch._dynamo.graph_break()"),
    }
    assert all(b.filename == __file__ and not b.skipped_frame for b in run.graph_breaks)
    assert not run.recompiles
    assert run.frames[0].function == "_breaks_twice" and run.frames[0].compile_id == "0/0"
    assert run.compile_seconds > 0


def test_recompiles_carry_dynamos_guard_failures():
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: x.cos() * 2, backend="eager")
    with watching() as run:
        compiled(torch.randn(4))
        compiled(torch.randn(4, 2))
    torch._dynamo.reset()
    (again,) = run.recompiles
    assert again.compile_id == "0/1" and "rank" in again.recompile_reason
    assert run.frame("0/1") is again and run.frame("7/7") is None


def test_a_break_in_a_loop_skips_the_frame_and_says_so():
    torch._dynamo.reset()
    compiled = torch.compile(_breaks_in_a_loop, backend="eager")
    with watching() as run:
        compiled(torch.randn(3))
    torch._dynamo.reset()
    skipped = [b for b in run.graph_breaks if b.skipped_frame]
    assert skipped and skipped[0].lineno == _line_of(_breaks_in_a_loop, "print(i)")
    assert any(f.failure for f in run.frames)


def test_what_was_there_before_the_block_is_not_reported():
    torch._dynamo.reset()
    torch.compile(_breaks_twice, backend="eager")(torch.randn(2))
    with watching() as run:
        pass
    torch._dynamo.reset()
    assert run.graph_breaks == [] and run.frames == []


def test_names_and_reasons_read_as_the_user_wrote_them():
    assert (
        function_name("torch_dynamo_resume_in_forward_at_12") == "forward (resumed after line 12)"
    )
    assert function_name("forward") == "forward"
    reason = (
        "Failed to trace builtin operator\n"
        "  Explanation: Dynamo does not know how to trace `print`\n"
        "  Hint: Avoid calling `print`.\n"
        "  Hint: Please report an issue to PyTorch.\n\n"
        "*** While handling this graph break, another graph break occurred: ***\n\n"
        "graph break in loop\n"
        "  Explanation: Skipping the frame.\n"
    )
    assert headline(reason) == (
        "Failed to trace builtin operator: Dynamo does not know how to trace `print` -> then "
        "graph break in loop: Skipping the frame."
    )
    assert hint(reason) == "Avoid calling `print`."
    assert (
        headline("call_function BuiltinVariable(print)") == "call_function BuiltinVariable(print)"
    )
    assert hint("no hint here") == ""
