"""Errors raised by the backends when generated code fails to build."""


class CompileError(RuntimeError):
    """A generated source failed to compile; carries the source and the compiler's log."""

    def __init__(self, message: str, *, source: str, log: str) -> None:
        super().__init__(message)
        self.source = source
        self.log = log


CONTEXT_LINES = 2
MAX_LOCATIONS = 8


def source_excerpts(source: str, filename: str, line_numbers: list[int]) -> str:
    """Numbered source lines around each reported line (the first few), `>` marking it."""
    lines = source.splitlines()
    width = len(str(len(lines)))
    blocks = []
    for number in [n for n in line_numbers if 0 < n <= len(lines)][:MAX_LOCATIONS]:
        first = max(1, number - CONTEXT_LINES)
        last = min(len(lines), number + CONTEXT_LINES)
        block = [f"{filename}:{number}:"]
        for n in range(first, last + 1):
            marker = ">" if n == number else " "
            block.append(f"{marker} {n:>{width}} | {lines[n - 1]}".rstrip())
        blocks.append("\n".join(block))
    return "\n".join(blocks)
