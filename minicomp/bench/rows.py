"""JSON Lines result files: each row is appended and flushed the moment it is measured, so a
run killed halfway (a timeout, a crash in a later row) leaves every finished row readable."""

from __future__ import annotations

import json
import math
import os
from typing import Any


def clean(value: Any) -> Any:
    """`value` as strict JSON: non-finite floats become None, tuples lists, unknown objects
    their str()."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


class RowWriter:
    """Appends rows to a JSON Lines file, one line each, flushed to disk as it is written.

    A path of None writes nothing (so callers need not test for it)."""

    def __init__(self, path: str | os.PathLike | None):
        self.path = os.fspath(path) if path else None
        if self.path:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)

    def write(self, row: dict) -> None:
        """Append `row` and make it durable before returning."""
        if not self.path:
            return
        line = json.dumps(clean(row), sort_keys=False) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


def read_rows(path: str | os.PathLike) -> list[dict]:
    """Every complete row of a JSON Lines file. A line cut short by a kill (the last one) or
    any other line that is not a JSON object is skipped."""
    rows = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows
