"""Errors raised by the backends when generated code fails to build."""


class CompileError(RuntimeError):
    """A generated source failed to compile; carries the source and the compiler's log."""

    def __init__(self, message: str, *, source: str, log: str) -> None:
        super().__init__(message)
        self.source = source
        self.log = log
