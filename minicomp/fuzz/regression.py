"""Save a minimal failing case as a pytest file (the program as plain Python, an xfail test
comparing minicomp with eager), and read back the signatures of the saved ones."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

from minicomp.fuzz.check import CRASH, ERROR, HANG, MISMATCH, Outcome
from minicomp.fuzz.printer import IMPORTS, program_source
from minicomp.fuzz.program import Case

_COLUMNS = 100
# tests/fuzz/regressions of the checkout this package sits in.
DEFAULT_FOLDER = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "tests",
    "fuzz",
    "regressions",
)


@dataclass(frozen=True)
class Signature:
    """What a saved finding is known by: a finding with the same status and pattern, on one of
    the targets, whose program uses all of `ops`, is that finding again. An error's pattern
    (its exception and message) says enough alone; a wrong value or a crash needs the ops."""

    status: str
    pattern: str
    targets: tuple[str, ...]
    ops: tuple[str, ...]

    def matches(self, target_name: str, outcome: Outcome, ops: set[str]) -> bool:
        """Whether a finding is this one again."""
        return (
            outcome.status == self.status
            and outcome.pattern == self.pattern
            and target_name in self.targets
            and (self.status == ERROR or set(self.ops) <= ops)
        )


def signature_of(case: Case, outcome: Outcome, targets: tuple[str, ...]) -> Signature:
    """The signature of a minimal case failing on `targets`."""
    ops = tuple(sorted({step.op for step in case.program.steps}))
    return Signature(outcome.status, outcome.pattern, tuple(targets), ops)


def short_hash(case: Case, outcome: Outcome) -> str:
    """Eight hex digits naming a finding by its program, run and failure."""
    text = "\n".join(
        [program_source(case.program), str(case.dynamic), str(case.backward), outcome.pattern]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def describe(outcome: Outcome, in_pytorch: bool = False) -> str:
    """A one-line default reason for the xfail marker; a person may write a better one."""
    first = outcome.message.strip().splitlines()[0] if outcome.message.strip() else ""
    where = "PyTorch (aot_eager too): " if in_pytorch else ""
    if outcome.status == MISMATCH:
        return f"{where}wrong result ({outcome.pattern}): {first}"[:200]
    if outcome.status in (CRASH, HANG):
        return f"{where}the process {'dies' if outcome.status == CRASH else 'hangs'}: {first}"[:200]
    return f"{where}raises {first}"[:200]


def string_literal(text: str, column: int, indent: int = 0) -> str:
    """text as Python source starting at `column` of a line indented by `indent`: one string
    literal, or, too long for the line, several in parentheses (Python joins them)."""
    one = json.dumps(text)
    if column + len(one) <= _COLUMNS:
        return one
    # Four spaces, two quotes and a piece's trailing space fit in the line.
    width = _COLUMNS - indent - 7
    pieces = re.findall(rf".{{1,{width}}}(?:\s|$)|.{{1,{width}}}", text)
    lines = [" " * (indent + 4) + json.dumps(piece) for piece in pieces if piece]
    return "(\n" + "\n".join(lines) + "\n" + " " * indent + ")"


def _signature_source(signature: Signature) -> str:
    pattern = string_literal(signature.pattern, len('    "pattern": '), indent=4)
    return "\n".join(
        [
            "SIGNATURE = {",
            f'    "status": {json.dumps(signature.status)},',
            f'    "pattern": {pattern},',
            f'    "targets": {json.dumps(list(signature.targets))},',
            f'    "ops": {json.dumps(list(signature.ops))},',
            "}",
        ]
    )


def regression_source(
    case: Case,
    outcome: Outcome,
    targets: tuple[str, ...],
    *,
    reason: str | None = None,
    seed: int | None = None,
    in_pytorch: bool = False,
) -> str:
    """A pytest module that checks the case's program against eager on `targets`."""
    name = short_hash(case, outcome)
    source = program_source(case.program)
    imports = IMPORTS if "F." in source else "import torch\n"
    isolated = outcome.status in (CRASH, HANG)
    found = f" (seed {seed})" if seed is not None else ""
    reason = reason or describe(outcome, in_pytorch)
    head = [
        f'"""Fuzzer finding {name}: {outcome.status} on {", ".join(targets)}.',
        "",
        f"Found by `python -m minicomp.fuzz`{found} and shrunk to this program.",
        '"""',
        "",
    ]
    if isolated:
        head += ["import subprocess", "import sys", ""]
    head += ["import pytest", imports, "from minicomp.fuzz.check import check_against_eager", ""]
    head += [
        "# The fuzzer's CI run takes a finding that matches this for this one, not a new one.",
        _signature_source(signature_of(case, outcome, targets)),
        "# Why the test fails: what is wrong, in words.",
        f"REASON = {string_literal(reason, len('REASON = '))}",
        "",
        "",
        "",
    ]
    call = (
        "check_against_eager(fn, make_inputs, target={target}, "
        f"dynamic={case.dynamic}, backward={case.backward})"
    )
    raises = ", raises=AssertionError" if outcome.status == MISMATCH else ""
    test = [
        "",
        "",
        f"@pytest.mark.xfail(strict=True{raises}, reason=REASON)",
        f'@pytest.mark.parametrize("target", {json.dumps(list(targets))})',
        f"def test_fuzz_{name}(target):",
    ]
    if isolated:
        test += [
            "    # The bug kills the process: check in a child.",
            "    child = subprocess.run(",
            "        [sys.executable, __file__, target], capture_output=True, text=True",
            "    )",
            "    assert child.returncode == 0, child.stderr[-3000:]",
            "",
            "",
            'if __name__ == "__main__":',
            "    " + call.format(target="sys.argv[1]"),
        ]
    else:
        test.append("    " + call.format(target="target"))
    return "\n".join(head) + source + "\n".join(test) + "\n"


def _format(path: str) -> None:
    # Input expressions can pass 100 columns; the project's formatter wraps them when present.
    ruff = shutil.which("ruff") or os.path.join(os.path.dirname(sys.executable), "ruff")
    if os.path.exists(ruff):
        subprocess.run([ruff, "format", "--quiet", path], check=False)


def save(
    case: Case,
    outcome: Outcome,
    targets: tuple[str, ...],
    folder: str = DEFAULT_FOLDER,
    **kwargs,
) -> str:
    """Write the regression test of a finding into `folder`; its path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"test_fuzz_{short_hash(case, outcome)}.py")
    text = regression_source(case, outcome, targets, **kwargs)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    _format(path)
    return path


def known_signatures(folder: str = DEFAULT_FOLDER) -> list[Signature]:
    """The signatures of the regression tests saved in `folder`."""
    found = []
    if not os.path.isdir(folder):
        return found
    for entry in sorted(os.listdir(folder)):
        if not (entry.startswith("test_fuzz_") and entry.endswith(".py")):
            continue
        with open(os.path.join(folder, entry)) as f:
            tree = ast.parse(f.read())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "SIGNATURE" for t in node.targets
            ):
                value = ast.literal_eval(node.value)
                found.append(
                    Signature(
                        value["status"],
                        value["pattern"],
                        tuple(value["targets"]),
                        tuple(value["ops"]),
                    )
                )
    return found
