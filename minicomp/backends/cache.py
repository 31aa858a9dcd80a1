"""The on-disk build cache the compiler drivers share: content hashes and atomic publishing.

A build is keyed by `digest` of everything that changes its output, written into a temporary
directory beside its final place, and moved there with one rename by `publish`, so concurrent
processes never see half a build and the first finished one wins.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterable


def digest(parts: Iterable[str | bytes]) -> str:
    """The SHA-256 hex digest of a sequence of strings, each length-prefixed so that
    ("ab", "c") and ("a", "bc") differ."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def entry_dir(cache_dir: str, kind: str, key: str) -> str:
    """The directory of the build `key` in the `kind` folder (kernels, cubins...) of a cache,
    fanned out by the key's first two characters."""
    return os.path.join(cache_dir, kind, key[:2], key)


def make_temp_dir(final_dir: str, label: str) -> str:
    """A fresh temporary directory beside `final_dir` (on the same file system, so that
    `publish` can rename it), its name showing `label`."""
    parent = os.path.dirname(final_dir)
    os.makedirs(parent, exist_ok=True)
    label = re.sub(r"[^\w.-]", "_", label)
    return tempfile.mkdtemp(prefix=f".tmp-{label}-", dir=parent)


def publish(tmp_dir: str, final_dir: str, product: str) -> None:
    """Move a finished build into place atomically; a build already there wins.

    `product` is the file (relative to the build directory) whose presence marks a complete
    build. The temporary directory is made world-readable first: mkdtemp creates it 0700.
    """
    os.chmod(tmp_dir, 0o755)
    for _ in range(3):
        try:
            os.rename(tmp_dir, final_dir)
            return
        except OSError:
            if os.path.isfile(os.path.join(final_dir, product)):
                return  # another process published the same build first
            # A directory without the product (an interrupted clean-up): take its place.
            shutil.rmtree(final_dir, ignore_errors=True)
    os.rename(tmp_dir, final_dir)
