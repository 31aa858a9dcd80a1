"""The on-disk build cache the compiler drivers share: content hashes, verified entries and
atomic publishing.

A build is keyed by `digest` of everything that changes its output and lives in
`<root>/<kind>/<key[:2]>/<key>/`. It is made in a private directory under `<root>/building/`
(which `minicomp cache clear` and `prune` leave alone), then `publish` records every file's
SHA-256 in the build's `meta.json` and moves the directory into place with one rename, so
concurrent processes never see half a build and the first finished one wins. `lookup` checks
an entry against its `meta.json` before anyone uses it: a damaged one (truncated, edited,
planted) is moved to `<root>/quarantine/` with one warning, and the caller builds it again.

Processes sharing a cache (the ranks of a distributed job on one machine) build each entry
once: `build_lock` is a lock file per entry, under `<root>/building/locks/`, that the first
process to miss an entry holds while it builds; the others wait for it, then find the entry
built. Every entry's meta.json records who built it (`builder`: rank, host, process id), and
`observing` collects, for the compile record, which entries a build used and who made them.

The root itself must belong to this user and be writable by no one else (`trusted_root`):
anyone who can write there could plant a library that minicomp then loads.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import stat
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

META_NAME = "meta.json"
"""The file of an entry that records each other file's SHA-256 (under "files"), and whatever
else its driver stores there."""
BUILDING = "building"
"""The folder of the root holding builds in progress."""
QUARANTINE = "quarantine"
"""The folder of the root where damaged entries are moved."""
LOCKS = os.path.join(BUILDING, "locks")
"""The folder of the root holding a lock file per entry being built."""
LOCK_TIMEOUT = 1800.0
"""Seconds a process waits for another's build of an entry before building it itself: only a
hung builder lasts that long (a builder that dies releases its lock at once)."""
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
        meta = verify(final_dir)
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
    _note(final_dir, built=False, builder=meta.get("built_by"))
    return meta


def publish(tmp_dir: str, final_dir: str, meta: Mapping | None = None) -> None:
    """Record the SHA-256 of every file of the build in `tmp_dir` (with `meta`, and who built
    it under "built_by" unless `meta` says) in its meta.json and move it to `final_dir`
    atomically; afterwards `final_dir` holds a verified
    build: this one, or the same build another process published first.

    The directory is made world-readable first (mkdtemp creates it 0700; the root's own mode
    keeps others out). A parent removed meanwhile by `minicomp cache clear` is made again.
    """
    _write_meta(tmp_dir, {"built_by": builder(), **(meta or {})})
    os.chmod(tmp_dir, 0o755)
    _note(final_dir, built=True, builder=builder())
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


def builder() -> dict:
    """Who builds in this process: its rank in a distributed job (torch.distributed's when a
    process group is up, else the RANK variable torchrun sets; absent outside a job), host
    and process id."""
    who: dict = {"host": socket.gethostname(), "pid": os.getpid()}
    rank = _rank()
    if rank is not None:
        who["rank"] = rank
    return who


def _rank() -> int | None:
    # Only when the program loaded torch.distributed: importing it costs time, and a program
    # that did not has no process group.
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except (RuntimeError, ValueError):
        pass
    value = os.environ.get("RANK", "")
    return int(value) if value.isdigit() else None


def describe_builder(who: Mapping | None) -> str:
    """`who` (a meta.json's "built_by") in words: "rank 1 (pid 4242)", "pid 4242" outside a
    distributed job, "this process (rank 0)", with the host when it is not this one; "an
    unknown process" for an entry that does not say."""
    if not who:
        return "an unknown process"
    here = who.get("host") == socket.gethostname()
    rank = f"rank {who['rank']}" if who.get("rank") is not None else ""
    if here and who.get("pid") == os.getpid():
        return f"this process ({rank})" if rank else "this process"
    pid = f"pid {who['pid']}" if who.get("pid") is not None else "another process"
    text = f"{rank} ({pid})" if rank else pid
    return text if here or not who.get("host") else f"{text} on {who['host']}"


@dataclass(frozen=True)
class BuildEvent:
    """One cache entry a build used: found (`built` false) or built by this process, and who
    built it (a meta.json's "built_by")."""

    kind: str  # the root's folder: kernels, headers, cubins, graphs
    key: str
    built: bool
    builder: Mapping | None


_observers = threading.local()


@contextlib.contextmanager
def observing() -> Iterator[list[BuildEvent]]:
    """Collect a BuildEvent for every entry this thread finds or builds meanwhile."""
    events: list[BuildEvent] = []
    stack = _observers.__dict__.setdefault("stack", [])
    stack.append(events)
    try:
        yield events
    finally:
        stack.remove(events)


def _note(final_dir: str, *, built: bool, builder: Mapping | None) -> None:
    stack = getattr(_observers, "stack", None)
    if not stack:
        return
    kind = os.path.basename(os.path.dirname(os.path.dirname(final_dir)))
    event = BuildEvent(kind, os.path.basename(final_dir), built, builder)
    for events in stack:
        events.append(event)


def note_found(final_dir: str) -> None:
    """Note an entry used again from a process's memory (no lookup on disk) for `observing`,
    with who built it as its meta.json says."""
    if not getattr(_observers, "stack", None):
        return
    try:
        with open(os.path.join(final_dir, META_NAME), "rb") as f:
            who = json.loads(f.read()).get("built_by")
    except (OSError, ValueError, AttributeError):
        who = None
    _note(final_dir, built=False, builder=who)


@contextlib.contextmanager
def build_lock(cache_dir: str, final_dir: str, *, timeout: float = LOCK_TIMEOUT) -> Iterator[bool]:
    """Hold the lock of the entry `final_dir` while building it; yields whether it is held.

    A process that finds no entry takes the lock, looks again (another may have built it
    meanwhile) and builds only when it is still missing: processes sharing a cache build each
    entry once, the others wait and load it. The lock is an exclusive `flock` on a file under
    `<cache_dir>/building/locks/`, which the kernel releases when its holder dies; its holder
    removes it when done. A process that waited `timeout` seconds builds without it (yields
    False).
    """
    kind = os.path.basename(os.path.dirname(os.path.dirname(final_dir)))
    folder = os.path.join(cache_dir, LOCKS)
    path = os.path.join(folder, f"{kind}-{os.path.basename(final_dir)}.lock")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        fd = _acquire(path, time.monotonic() + timeout)
        unlockable = None
    except OSError as err:  # a read-only cache: its builds fail (or hit) on their own
        fd, unlockable = None, err
    if unlockable is not None:
        log.debug("minicomp: no lock for %s (%s)", final_dir, unlockable)
        yield False
        return
    if fd is None:
        log.warning(
            "minicomp: waited %.0f s for another process's build of %s; building it here",
            timeout,
            final_dir,
        )
        yield False
        return
    try:
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(builder()).encode())
        yield True
    finally:
        # Removed while still locked: a process that opened it meanwhile and then gets the
        # lock sees the file gone (_acquire) and takes the next one.
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)


def _acquire(path: str, deadline: float) -> int | None:
    """A descriptor of the lock file `path` holding its exclusive lock, or None at the
    deadline."""
    delay, told = 0.002, False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not told:
                        told = True
                        log.info("minicomp: waiting for %s to build %s", _holder(fd), path)
                    if time.monotonic() > deadline:
                        os.close(fd)
                        return None
                    time.sleep(delay)
                    delay = min(delay * 2, 0.1)
            try:
                current = os.stat(path)
            except FileNotFoundError:
                current = None
            mine = os.fstat(fd)
            if current is not None and (current.st_dev, current.st_ino) == (
                mine.st_dev,
                mine.st_ino,
            ):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # its holder removed it when done: lock the file there now


def _holder(fd: int) -> str:
    try:
        return describe_builder(json.loads(os.pread(fd, 4096, 0) or b"{}"))
    except (OSError, ValueError):
        return "another process"
