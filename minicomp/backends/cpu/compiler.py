"""The C compiler driver: C source to a cached shared library, loaded with ctypes.

A loaded library stays loaded while something refers to it: its ``ctypes.CDLL`` or a function
taken from it (a ctypes function keeps its library alive), so the modules and plans that launch
its kernels. When the last reference goes, the library is unloaded (``dlclose``): a process
compiling graph after graph does not keep every library it ever loaded mapped.
"""

import collections
import contextlib
import ctypes
import os
import platform
import re
import shlex
import shutil
import struct
import subprocess
import threading
import time
import weakref
from _ctypes import dlclose
from collections.abc import Sequence
from dataclasses import dataclass

from minicomp.backends import cache
from minicomp.backends.errors import CompileError, source_excerpts

CODEGEN_VERSION = "2"
"""Part of every cache key: bump it when a build changes in a way the other key parts miss."""

_SOURCE_NAME = "source.c"
_LIBRARY_NAME = "lib.so"
_HEADER_NAME = "prelude.h"
_MAX_LOG_LINES = 200
_LOCATION = re.compile(r"^(?P<file>[^\s:]+):(?P<line>\d+):", re.MULTILINE)


@dataclass(frozen=True)
class CacheStats:
    """Counters of the kernel cache since the process started (or the last reset)."""

    memory_hits: int
    disk_hits: int
    misses: int  # libraries this process built
    compile_seconds: float
    header_builds: int = 0  # precompiled headers this process built

    @property
    def hits(self) -> int:
        return self.memory_hits + self.disk_hits


_lock = threading.Lock()
# (source, cc, cflags, cache_dir) -> library path; lets a repeated compile skip hashing and disk.
_built: dict[tuple[str, str, str, str], str] = {}
_headers: dict[tuple[str, str, str, str], str] = {}
_compiler_ids: dict[str, str] = {}
# Path -> the library loaded from it, while anything refers to it.
_libraries: "weakref.WeakValueDictionary[str, ctypes.CDLL]" = weakref.WeakValueDictionary()
# What compile_c loaded, kept until clear_memory_cache: its callers load the path afterwards.
_pinned: dict[str, ctypes.CDLL] = {}
# Path -> its keys in _built, forgotten when the library is unloaded (see _forget_unloaded).
_memo_keys: dict[str, set[tuple[str, str, str, str]]] = {}
_unloaded: collections.deque[str] = collections.deque()
# The libraries ours link to (libgomp...), kept loaded: their threads outlive ours.
_dependencies: dict[str, ctypes.CDLL] = {}
_host_cpu_text: str | None = None
_counters: dict[str, float] = {}


def _count(name: str, amount: float = 1) -> None:
    with _lock:
        _counters[name] = _counters.get(name, 0) + amount


def cache_stats() -> CacheStats:
    """Return a snapshot of the cache hit, miss and compile-time counters."""
    with _lock:
        return CacheStats(
            memory_hits=int(_counters.get("memory_hits", 0)),
            disk_hits=int(_counters.get("disk_hits", 0)),
            misses=int(_counters.get("misses", 0)),
            compile_seconds=float(_counters.get("compile_seconds", 0.0)),
            header_builds=int(_counters.get("header_builds", 0)),
        )


def reset_cache_stats() -> None:
    """Set every counter of :func:`cache_stats` back to zero."""
    with _lock:
        _counters.clear()


def clear_memory_cache() -> None:
    """Forget which sources were built in this process, so the next compile looks on disk.

    Libraries already loaded stay loaded while something refers to them (see the module's
    docstring); those :func:`compile_c` kept loaded for its callers are let go.
    """
    with _lock:
        _built.clear()
        _memo_keys.clear()
        _headers.clear()
        pinned = list(_pinned.values())
        _pinned.clear()
    del pinned  # unloaded here, outside the lock, when nothing else refers to them


def _run(command: list[str], cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    # The C locale keeps the compiler's messages in English with ASCII quotes, as we parse them.
    env = dict(os.environ, LC_ALL="C")
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)


def _find_compiler(cc: str, source: str) -> str:
    path = shutil.which(cc)
    if path is None:
        raise CompileError(
            f"C compiler {cc!r} not found; set the cc option (MINICOMP_CC) to an installed one",
            source=source,
            log="",
        )
    return path


def _compiler_id(path: str) -> str:
    """The first line of ``path --version``, run once per compiler per process."""
    with _lock:
        known = _compiler_ids.get(path)
    if known is not None:
        return known
    try:
        proc = _run([path, "--version"])
        text = (proc.stdout or proc.stderr).strip()
        ident = text.splitlines()[0] if text else f"exit status {proc.returncode}"
    except OSError as err:
        ident = f"unrunnable: {err}"
    with _lock:
        _compiler_ids[path] = ident
    return ident


def _host_cpu() -> str:
    """Text naming the host CPU and its features, which decide what -march=native emits."""
    global _host_cpu_text
    if _host_cpu_text is None:
        wanted = ("model name", "flags", "features", "cpu part")
        found: dict[str, str] = {}
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    key = key.strip().lower()
                    if key in wanted and key not in found:
                        found[key] = value.strip()
        except OSError:
            pass
        if not found:
            found["platform"] = f"{platform.machine()} {platform.processor()}"
        _host_cpu_text = "\n".join(f"{k}: {v}" for k, v in sorted(found.items()))
    return _host_cpu_text


def _key(source: str, compiler: str, flags: list[str]) -> str:
    parts = [CODEGEN_VERSION, compiler, _compiler_id(compiler), "\0".join(flags), source]
    if any(flag.endswith("=native") for flag in flags):
        parts.append(_host_cpu())
    return cache.digest(parts)


def cache_key(source: str, *, cc: str, cflags: str) -> str:
    """Return the content hash under which ``compile_c`` stores this build."""
    return _key(source, _find_compiler(cc, source), shlex.split(cflags))


def compile_c(
    source: str,
    *,
    cc: str,
    cflags: str,
    cache_dir: str,
    name: str = "kernels",
    headers: Sequence[str] = (),
) -> str:
    """Compile C ``source`` into a shared library, load it, and return the library's path.

    Builds are cached under ``<cache_dir>/kernels/<key[:2]>/<key>/`` (``lib.so``, the
    ``source.c`` it came from and ``meta.json`` with their hashes), keyed by :func:`cache_key`,
    and shared safely between concurrent processes. A cached library is checked against its
    hashes before it is loaded (a damaged one is built again, with a CacheIntegrityWarning),
    and it is loaded here and kept loaded until :func:`clear_memory_cache`, so that a clean-up
    of the cache cannot take it away before the caller's :func:`load_library`. ``headers`` are
    :func:`precompiled_header` paths that the source includes by :func:`include_name`.
    ``name`` only labels the build in temporary files and error messages. Raises
    :class:`CompileError` when the compiler fails, and
    :class:`~minicomp.backends.cache.UntrustedCacheError` for a cache root that other users can
    write.
    """
    library = compile_library(
        source, cc=cc, cflags=cflags, cache_dir=cache_dir, name=name, headers=headers
    )
    with _lock:
        _pinned[library._name] = library
    return library._name


def compile_library(
    source: str,
    *,
    cc: str,
    cflags: str,
    cache_dir: str,
    name: str = "kernels",
    headers: Sequence[str] = (),
    links: Sequence[tuple[str, str]] = (),
) -> ctypes.CDLL:
    """Compile and load like :func:`compile_c`, and return the loaded library (its path is
    ``library._name``), unloaded once nothing refers to it or to a function of it.

    ``links`` are ``(path, file name)`` pairs of shared libraries to link with: each is linked
    under its file name (which must name its contents, as the key holds the name only), and
    must be loaded before this library is, as nothing tells the loader where it lies.
    """
    cache_dir = os.path.abspath(os.path.expanduser(cache_dir))
    memo_key = (source, cc, cflags, cache_dir, tuple(links))
    with _lock:
        _forget_unloaded()
        path = _built.get(memo_key)
        library = _libraries.get(path) if path is not None else None
        if library is not None:
            _counters["memory_hits"] = _counters.get("memory_hits", 0) + 1
    if library is not None:
        cache.note_found(os.path.dirname(path))
        return library
    compiler = _find_compiler(cc, source)
    flags = shlex.split(cflags) + [f"./{file}" for _, file in links]
    key = _key(source, compiler, flags)
    cache.trusted_root(cache_dir)
    final_dir = cache.entry_dir(cache_dir, "kernels", key)
    path = os.path.join(final_dir, _LIBRARY_NAME)
    for attempt in range(2):
        if cache.lookup(cache_dir, final_dir, _LIBRARY_NAME) is not None:
            _count("disk_hits")
        else:
            # Processes sharing the cache (a job's ranks) build it once: the others wait.
            with cache.build_lock(cache_dir, final_dir):
                if cache.lookup(cache_dir, final_dir, _LIBRARY_NAME) is not None:
                    _count("disk_hits")
                else:
                    _build(source, compiler, flags, cache_dir, final_dir, name, headers, links)
        try:
            library = load_library(path)
            break
        except OSError:
            # A clean-up may have removed the build between its check and the load: build it
            # again, once.
            if attempt or os.path.isfile(path):
                raise
    with _lock:
        _built[memo_key] = path
        _memo_keys.setdefault(path, set()).add(memo_key)
    return library


def include_name(header: str) -> str:
    """How a source compiled with ``compile_c(headers=[header])`` includes ``header`` (a
    :func:`precompiled_header` path): relative, so that a moved or copied cache still hits."""
    fan, key, file = header.split(os.sep)[-3:]
    return f"{fan}/{key}/{file}"


def precompiled_header(
    text: str, *, cc: str, cflags: str, cache_dir: str, name: str = "prelude"
) -> str:
    """Store header ``text`` in the cache and return its path, with the compiler's precompiled
    form beside it when the compiler makes one.

    A source whose first line includes this path, compiled with the same ``cflags``, then skips
    parsing the header: GCC looks for ``prelude.h.gch`` beside it and falls back to the text
    when the precompiled form is missing or was built differently, so the result never depends
    on it. Builds live under ``<cache_dir>/headers/``, keyed and checked like
    :func:`compile_c`'s.
    """
    cache_dir = os.path.abspath(os.path.expanduser(cache_dir))
    memo_key = (text, cc, cflags, cache_dir)
    with _lock:
        path = _headers.get(memo_key)
    if path is not None and os.path.isfile(path):  # a cache clean-up may have removed it
        cache.note_found(os.path.dirname(path))
        return path
    compiler = _find_compiler(cc, text)
    flags = shlex.split(cflags)
    cache.trusted_root(cache_dir)
    final_dir = cache.entry_dir(cache_dir, "headers", _key(text, compiler, flags))
    path = os.path.join(final_dir, _HEADER_NAME)
    if cache.lookup(cache_dir, final_dir, _HEADER_NAME) is None:
        with cache.build_lock(cache_dir, final_dir):
            if cache.lookup(cache_dir, final_dir, _HEADER_NAME) is None:
                _build_header(text, compiler, flags, cache_dir, final_dir, name)
    with _lock:
        _headers[memo_key] = path
    return path


def _build_header(
    text: str, compiler: str, flags: list[str], cache_dir: str, final_dir: str, name: str
) -> None:
    with cache.build_dir(cache_dir, name) as tmp_dir:
        with open(os.path.join(tmp_dir, _HEADER_NAME), "w", encoding="utf-8") as f:
            f.write(text)
        start = time.perf_counter()
        command = [compiler, _HEADER_NAME, "-o", _HEADER_NAME + ".gch", *flags]
        if _run(command, cwd=tmp_dir).returncode != 0:
            # The header still works as text; only the time it saves is lost.
            with contextlib.suppress(OSError):
                os.remove(os.path.join(tmp_dir, _HEADER_NAME + ".gch"))
        _count("compile_seconds", time.perf_counter() - start)
        _count("header_builds")
        cache.publish(tmp_dir, final_dir)


def _place_headers(headers: Sequence[str], tmp_dir: str) -> set[str]:
    """Link each header (and its precompiled form) into the build directory under its
    include_name, so that a clean-up of the cache during the build cannot take it away;
    return the folders to remove before publishing."""
    placed = set()
    for header in headers:
        folder = os.path.join(tmp_dir, os.path.dirname(include_name(header)))
        os.makedirs(folder, exist_ok=True)
        placed.add(os.path.join(tmp_dir, include_name(header).split("/")[0]))
        for file in (header, header + ".gch"):
            if file != header and not os.path.isfile(file):
                continue  # the compiler made no precompiled form
            _place_file(file, os.path.join(folder, os.path.basename(file)))
    return placed


def _place_file(file: str, target: str) -> None:
    """Hard-link ``file`` at ``target`` (a copy where links are refused)."""
    try:
        os.link(file, target)
    except FileNotFoundError:
        raise  # removed by a clean-up: the caller makes the file again
    except OSError:  # a file system without hard links
        shutil.copyfile(file, target)


def _build(
    source: str,
    compiler: str,
    flags: list[str],
    cache_dir: str,
    final_dir: str,
    name: str,
    headers: Sequence[str],
    links: Sequence[tuple[str, str]] = (),
) -> None:
    with cache.build_dir(cache_dir, name) as tmp_dir:
        with open(os.path.join(tmp_dir, _SOURCE_NAME), "w", encoding="utf-8") as f:
            f.write(source)
        placed = _place_headers(headers, tmp_dir)
        for path, file in links:
            _place_file(path, os.path.join(tmp_dir, file))
        command = [compiler, _SOURCE_NAME, "-o", _LIBRARY_NAME, *flags]
        if any(flag.startswith("-g") for flag in flags):
            # Debug info should name the directory the source ends up in, not the temporary one.
            command.append(f"-fdebug-prefix-map={tmp_dir}={final_dir}")
        start = time.perf_counter()
        proc = _run(command, cwd=tmp_dir)
        _count("misses")
        _count("compile_seconds", time.perf_counter() - start)
        log = (proc.stderr + proc.stdout).strip()
        if proc.returncode != 0 or not os.path.isfile(os.path.join(tmp_dir, _LIBRARY_NAME)):
            message = _failure_message(name, command, proc.returncode, log, source)
            raise CompileError(message, source=source, log=log)
        for folder in placed:
            shutil.rmtree(folder)
        for _, file in links:
            os.remove(os.path.join(tmp_dir, file))
        cache.publish(tmp_dir, final_dir)


def _failure_message(name: str, command: list[str], status: int, log: str, source: str) -> str:
    log_lines = log.splitlines()
    if len(log_lines) > _MAX_LOG_LINES:
        omitted = len(log_lines) - _MAX_LOG_LINES
        log_lines = log_lines[:_MAX_LOG_LINES] + [f"... ({omitted} more lines)"]
    parts = [
        f"C compilation of {name!r} failed (exit status {status})",
        f"command: {shlex.join(command)}",
        "compiler log:",
        *("  " + line for line in log_lines),
    ]
    excerpts = _source_excerpts(log, source)
    if excerpts:
        parts += ["source around the reported lines:", excerpts]
    return "\n".join(parts)


def _source_excerpts(log: str, source: str) -> str:
    """Numbered source lines around each ``source.c:LINE:`` of the log."""
    numbers: list[int] = []
    for match in _LOCATION.finditer(log):
        number = int(match["line"])
        if os.path.basename(match["file"]) == _SOURCE_NAME and number not in numbers:
            numbers.append(number)
    return source_excerpts(source, _SOURCE_NAME, numbers)


def load_library(path: str) -> ctypes.CDLL:
    """Load a shared library with ctypes: one object per path while anything refers to it or
    to a function of it, unloaded after that."""
    path = os.path.abspath(path)
    with _lock:
        library = _libraries.get(path)
        if library is None:
            library = ctypes.CDLL(path)
            _keep_dependencies(path)
            unload = weakref.finalize(library, _unload, library._handle, path)
            unload.atexit = False  # at exit, threads may still run its code
            _libraries[path] = library
    return library


def _unload(handle: int, path: str) -> None:
    # Runs when the last reference to the CDLL went, so no ctypes function of it remains; it
    # may run inside the garbage collector while this thread holds _lock: no locking here.
    dlclose(handle)
    _unloaded.append(path)


def _forget_unloaded() -> None:
    """Drop the memo entries of unloaded libraries (the caller holds _lock)."""
    while _unloaded:
        for memo_key in _memo_keys.pop(_unloaded.popleft(), ()):
            _built.pop(memo_key, None)


def forget_build(path: str) -> None:
    """Make the next :func:`compile_library` of the library at ``path`` look on disk, and
    build it again if it is gone, even while it stays loaded."""
    with _lock:
        for memo_key in _memo_keys.pop(os.path.abspath(path), ()):
            _built.pop(memo_key, None)


def _keep_dependencies(path: str) -> None:
    """Keep the libraries `path` links to loaded for good (the caller holds _lock): unloading
    an OpenMP runtime, say, with its thread pool still alive would crash the process."""
    for name in _needed_libraries(path):
        if name not in _dependencies:
            mode = os.RTLD_NOW | os.RTLD_NOLOAD | os.RTLD_NODELETE
            with contextlib.suppress(OSError):  # loaded under another name: nothing to keep
                _dependencies[name] = ctypes.CDLL(name, mode=mode)


def _needed_libraries(path: str) -> list[str]:
    """The DT_NEEDED names of the ELF shared library at `path` (none for another format)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF":
        return []
    wide, order = data[4] == 2, "<" if data[5] == 1 else ">"
    section, dynamic = (
        (order + "IIQQQQIIQQ", order + "qQ") if wide else (order + "10I", order + "iI")
    )
    shoff = struct.unpack_from(order + ("Q" if wide else "I"), data, 0x28 if wide else 0x20)[0]
    shentsize, shnum = struct.unpack_from(order + "HH", data, 0x3A if wide else 0x2E)
    headers = [struct.unpack_from(section, data, shoff + i * shentsize) for i in range(shnum)]
    names = []
    for _, kind, _, _, offset, size, link, *_ in headers:
        if kind != 6:  # SHT_DYNAMIC
            continue
        strings = headers[link][4]
        step = struct.calcsize(dynamic)
        for i in range(offset, offset + size, step):
            tag, value = struct.unpack_from(dynamic, data, i)
            if tag == 1:  # DT_NEEDED
                start = strings + value
                names.append(data[start : data.index(b"\0", start)].decode())
    return names
