"""The on-disk build cache the compiler drivers share: content hashes, verified entries and
atomic publishing.

A build is keyed by `digest` of everything that changes its output and lives in
`<root>/<kind>/<key[:2]>/<key>/`. It is made in a private directory under `<root>/building/`
(which `minicomp cache clear` and `prune` leave alone), then `publish` records every file's
SHA-256 in the build's `meta.json` and moves the directory into place with one rename, so
concurrent processes never see half a build and the first finished one wins. `lookup` checks
an entry against its `meta.json` before anyone uses it: a damaged one (truncated, edited,
planted) is moved to `<root>/quarantine/` with one warning, and the caller builds it again.

The root itself must belong to this user and be writable by no one else (`trusted_root`):
anyone who can write there could plant a library that minicomp then loads.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import uuid
import warnings
from collections.abc import Iterable, Iterator, Mapping

META_NAME = "meta.json"
"""The file of an entry that records each other file's SHA-256 (under "files"), and whatever
else its driver stores there."""
BUILDING = "building"
"""The folder of the root holding builds in progress."""
QUARANTINE = "quarantine"
"""The folder of the root where damaged entries are moved."""
_PUBLISH_TRIES = 5


class CacheError(RuntimeError):
    """The build cache cannot be used safely; the message names the path and what to do."""


class UntrustedCacheError(CacheError):
    """The cache root could be written by another user, so nothing built there can be trusted."""


class CacheIntegrityWarning(RuntimeWarning):
    """A cache entry did not match the hashes recorded when it was built; it is built again."""


class DamagedEntry(Exception):
    """An entry does not match its meta.json; the message says how."""


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


def trusted_root(cache_dir: str) -> str:
    """`cache_dir` as an absolute path, created (mode 0700) when missing; raises
    UntrustedCacheError when it is not a directory of this user that only this user can write
    (the check Inductor makes of its temporary directory)."""
    root = os.path.abspath(os.path.expanduser(cache_dir))
    os.makedirs(root, mode=0o700, exist_ok=True)
    info = os.stat(root)
    advice = "set the cache_dir option (MINICOMP_CACHE_DIR) to a directory of your own"
    if not stat.S_ISDIR(info.st_mode):
        raise UntrustedCacheError(f"the minicomp cache root {root} is not a directory; {advice}")
    if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
        raise UntrustedCacheError(
            f"the minicomp cache root {root} belongs to user id {info.st_uid}, not to this user "
            f"({os.geteuid()}): its owner could plant the binaries minicomp loads; {advice}"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UntrustedCacheError(
            f"the minicomp cache root {root} is writable by other users (mode "
            f"{stat.S_IMODE(info.st_mode):o}): they could plant the binaries minicomp loads; run "
            f"`chmod go-w {root}` or {advice}"
        )
    return root


@contextlib.contextmanager
def build_dir(cache_dir: str, label: str) -> Iterator[str]:
    """A fresh private directory under `<cache_dir>/building/` to build in (on the cache's file
    system, so that `publish` can rename it), removed on exit unless it was published."""
    parent = os.path.join(cache_dir, BUILDING)
    os.makedirs(parent, mode=0o700, exist_ok=True)
    path = tempfile.mkdtemp(prefix=re.sub(r"[^\w.-]", "_", label) + "-", dir=parent)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _write_meta(folder: str, meta: Mapping | None) -> None:
    files = {name: _sha256(os.path.join(folder, name)) for name in sorted(os.listdir(folder))}
    with open(os.path.join(folder, META_NAME), "w", encoding="utf-8") as f:
        json.dump({**(meta or {}), "files": files}, f, indent=1, sort_keys=True)


def _parse_meta(data: bytes) -> dict:
    try:
        meta = json.loads(data)
    except (ValueError, RecursionError) as err:
        raise DamagedEntry(f"unreadable {META_NAME}: {err}") from None
    files = meta.get("files") if isinstance(meta, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise DamagedEntry(f"{META_NAME} records no file hashes")
    return meta


def _compare(recorded: Mapping[str, str], found: Mapping[str, str]) -> None:
    for name in sorted(set(recorded) | set(found)):
        if name not in found:
            raise DamagedEntry(f"{name} is missing")
        if name not in recorded:
            raise DamagedEntry(f"{name} was not part of the build")
        if recorded[name] != found[name]:
            raise DamagedEntry(f"{name} differs from the file built")


def verify(folder: str) -> dict:
    """The meta.json of the entry in `folder` when every file matches the SHA-256 recorded in
    it and no other file is there; raises DamagedEntry (or OSError when unreadable)."""
    with open(os.path.join(folder, META_NAME), "rb") as f:
        meta = _parse_meta(f.read())
    found = {}
    for entry in os.scandir(folder):
        if entry.name == META_NAME:
            continue
        if not entry.is_file(follow_symlinks=False):
            raise DamagedEntry(f"{entry.name} is not a regular file")
        found[entry.name] = _sha256(entry.path)
    _compare(meta["files"], found)
    return meta


def verify_contents(files: Mapping[str, bytes]) -> dict:
    """:func:`verify` for an entry held in memory (a bundle's), its files by name."""
    if META_NAME not in files:
        raise DamagedEntry(f"no {META_NAME}")
    meta = _parse_meta(files[META_NAME])
    found = {n: hashlib.sha256(d).hexdigest() for n, d in files.items() if n != META_NAME}
    _compare(meta["files"], found)
    return meta


def quarantine(cache_dir: str, final_dir: str, reason: str, *, warn: bool = True) -> None:
    """Move the damaged entry `final_dir` to `<cache_dir>/quarantine/` (with a
    CacheIntegrityWarning unless `warn` is false), so that it is built again. An entry that
    vanished meanwhile needs nothing; one that cannot be moved raises CacheError."""
    folder = os.path.join(cache_dir, QUARANTINE)
    kind = os.path.basename(os.path.dirname(os.path.dirname(final_dir)))
    dest = os.path.join(folder, f"{kind}-{os.path.basename(final_dir)}-{uuid.uuid4().hex[:8]}")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        os.rename(final_dir, dest)
    except FileNotFoundError:
        return  # a concurrent clean-up or lookup took it first
    except OSError as err:
        shutil.rmtree(final_dir, ignore_errors=True)
        if os.path.lexists(final_dir):
            raise CacheError(
                f"the damaged cache entry {final_dir} ({reason}) cannot be moved aside "
                f"({err.strerror}); remove it, or run `minicomp cache clear`"
            ) from None
        dest = "nowhere (deleted)"
    if warn:
        warnings.warn(
            f"minicomp: the cache entry {final_dir} is damaged ({reason}); moved it to {dest} "
            "and building it again",
            CacheIntegrityWarning,
            stacklevel=3,
        )


def lookup(cache_dir: str, final_dir: str, product: str) -> dict | None:
    """The meta.json of the verified entry in `final_dir`, or None when there is none to use.

    A damaged entry is quarantined first, with a warning unless its `product` (the file that
    marks a complete build) is missing, as after an interrupted clean-up.
    """
    try:
        return verify(final_dir)
    except (DamagedEntry, OSError) as err:
        if not os.path.isdir(final_dir):
            return None  # no build, or a clean-up removed it while we read
        if isinstance(err, DamagedEntry):
            reason = str(err)
        elif not os.path.lexists(os.path.join(final_dir, META_NAME)):
            reason = f"no {META_NAME}"
        else:
            reason = f"unreadable: {err}"
        present = os.path.isfile(os.path.join(final_dir, product))
        quarantine(cache_dir, final_dir, reason, warn=present)
        return None


def publish(tmp_dir: str, final_dir: str, meta: Mapping | None = None) -> None:
    """Record the SHA-256 of every file of the build in `tmp_dir` (with `meta`) in its
    meta.json and move it to `final_dir` atomically; afterwards `final_dir` holds a verified
    build: this one, or the same build another process published first.

    The directory is made world-readable first (mkdtemp creates it 0700; the root's own mode
    keeps others out). A parent removed meanwhile by `minicomp cache clear` is made again.
    """
    _write_meta(tmp_dir, meta)
    os.chmod(tmp_dir, 0o755)
    for _ in range(_PUBLISH_TRIES):
        os.makedirs(os.path.dirname(final_dir), exist_ok=True)
        try:
            os.rename(tmp_dir, final_dir)
            return
        except FileNotFoundError:
            continue  # a clean-up removed the parent between makedirs and rename
        except OSError:
            try:
                verify(final_dir)
                return  # another process published the same build first
            except (DamagedEntry, OSError):
                # A leftover without its files (an interrupted clean-up): take its place.
                shutil.rmtree(final_dir, ignore_errors=True)
    os.makedirs(os.path.dirname(final_dir), exist_ok=True)
    os.rename(tmp_dir, final_dir)
