"""The `minicomp` command: explain a script, show the options, manage the caches, benchmark."""

import argparse
import contextlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata

from minicomp import config
from minicomp.backends import cache as build_cache
from minicomp.dynamo import graph_cache
from minicomp.tune import database


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 1."""


# The folders of backends/cache.py builds under the cache root: C and cuda-emu shared
# libraries (lib.so), NVRTC cubins (kernel.cubin), the emulator's precompiled headers and
# compiled graphs (lowered.pkl), each in <kind>/<key[:2]>/<key>/.
_BUILD_KINDS = ("kernels", "cubins", "headers", graph_cache.KIND)
# A build in progress (under building/, or a .tmp-* folder) untouched for this long crashed.
_STALE_TEMP_S = 3600.0
_SHOWN_FAILURES = 3
_REMOVING = ".tmp-removing-"
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def _cache_root(args: argparse.Namespace) -> str:
    cache_dir = args.cache_dir if args.cache_dir is not None else config.get("cache_dir")
    return os.path.abspath(os.path.expanduser(cache_dir))


def _database(args: argparse.Namespace) -> database.TuningDatabase:
    return database.TuningDatabase(database.default_path(_cache_root(args)))


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def parse_duration(text: str) -> float:
    """Seconds in a duration such as 90s, 45m, 12h, 30d or 2w; raises CliError."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([smhdw])\s*", text.lower())
    if match is None:
        raise CliError(f"bad duration {text!r}: expected a number and a unit (s, m, h, d or w)")
    return float(match[1]) * _DURATION_UNITS[match[2]]


def parse_size(text: str) -> int:
    """Bytes in a size such as 500M, 2G, 1.5GiB, 100KB or 4096 (binary units); raises
    CliError."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if match is None:
        raise CliError(f"bad size {text!r}: expected a number and an optional unit (K, M, G, T)")
    return int(float(match[1]) * _SIZE_UNITS[match[2]])


def _print_json(value: object) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def _when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp))


# -- kernel builds -----------------------------------------------------------------------


@dataclass
class _Build:
    path: str
    mtime: float
    size: int
    temporary: bool


def _scan(root: str, paths: Sequence[str] | None = None) -> dict[str, object]:
    """Libraries, cubins, compiled graphs, precompiled headers and bytes of every file under
    the build folders (or `paths`), with the bytes of each build folder."""
    libraries = cubins = graphs = headers = total = 0
    kinds = [os.path.join(root, kind) for kind in _BUILD_KINDS]
    sizes = {}
    for path in kinds if paths is None else paths:
        size = 0
        for folder, _dirs, files in os.walk(path):
            for file in files:
                try:
                    size += os.path.getsize(os.path.join(folder, file))
                except OSError:
                    continue  # removed by a concurrent clean-up
                libraries += file.endswith(".so")
                cubins += file.endswith(".cubin")
                graphs += file == graph_cache.PRODUCT
                headers += file.endswith(".gch")
        sizes[os.path.basename(path)] = size
        total += size
    return {
        "paths": kinds,
        "libraries": libraries,
        "cubins": cubins,
        "graphs": graphs,
        "precompiled_headers": headers,
        "bytes_by_folder": sizes,
        "bytes": total,
    }


def _dir_size(path: str) -> int:
    total = 0
    for folder, _dirs, files in os.walk(path):
        for file in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(folder, file))
    return total


def _folders(path: str) -> list[os.DirEntry]:
    with contextlib.suppress(OSError):
        return [e for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
    return []


def _builds(root: str) -> list[_Build]:
    """Every build directory <kind>/<fan>/<key>/ with its mtime (when it was built), the
    quarantined ones, and the temporary ones: builds in progress and unfinished removals."""
    found = [(e, True) for e in _folders(root) if e.name.startswith(_REMOVING)]
    for kind in _BUILD_KINDS:
        for fan in _folders(os.path.join(root, kind)):
            found += [(e, e.name.startswith(".tmp-")) for e in _folders(fan.path)]
    found += [(e, False) for e in _folders(os.path.join(root, build_cache.QUARANTINE))]
    building = _folders(os.path.join(root, build_cache.BUILDING))
    # Not the locks' folder: removing a lock file someone holds would let a second builder in.
    found += [(e, True) for e in building if e.path != os.path.join(root, build_cache.LOCKS)]
    builds = []
    for entry, temporary in found:
        with contextlib.suppress(OSError):
            mtime = entry.stat(follow_symlinks=False).st_mtime
            builds.append(_Build(entry.path, mtime, _dir_size(entry.path), temporary))
    return builds


def _rmtree(path: str) -> tuple[str, OSError] | None:
    """shutil.rmtree that carries on past errors and returns the first: (path, error)."""
    errors: list[tuple[str, OSError]] = []

    def record(_function, where, error) -> None:
        errors.append((where, error[1] if isinstance(error, tuple) else error))

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=record)
    else:
        shutil.rmtree(path, onerror=record)
    return errors[0] if errors else None


def _remove_tree(path: str) -> tuple[str, str] | None:
    """Remove a folder; None when it is gone, else the folder that stayed and what in it
    could not be removed, and why."""
    doomed = path
    if not os.path.basename(path).startswith(_REMOVING):
        # Rename first, so that no process sees a half-deleted build under its final name.
        doomed = os.path.join(os.path.dirname(path), f"{_REMOVING}{os.getpid()}-")
        doomed += os.path.basename(path)
        try:
            os.rename(path, doomed)
        except FileNotFoundError:
            return None  # removed by a concurrent clean-up
        except OSError:
            doomed = path
    error = _rmtree(doomed)
    if not os.path.lexists(doomed):
        return None
    where, why = error if error is not None else (doomed, None)
    return doomed, f"{where}: {getattr(why, 'strerror', None) or why or 'still there'}"


def _prune_builds(
    root: str, older_than_s: float | None, max_bytes: int | None, now: float
) -> tuple[list[_Build], int, list[str]]:
    """Remove builds older than the age, then the oldest until the rest fit in max_bytes;
    return the removed builds, the bytes left and what could not be removed. A temporary
    folder goes only when stale: younger ones are builds in progress."""
    chosen, kept, full = [], 0, False
    for build in sorted(_builds(root), key=lambda b: b.mtime, reverse=True):
        age = now - build.mtime
        if build.temporary:
            if age > _STALE_TEMP_S:
                chosen.append(build)
            else:
                kept += build.size  # never ours to remove
        elif older_than_s is not None and age > older_than_s:
            chosen.append(build)
        elif full or (max_bytes is not None and kept + build.size > max_bytes):
            full = True  # oldest first until the rest fits: everything older goes too
            chosen.append(build)
        else:
            kept += build.size
    removed, failures = [], []
    for build in chosen:
        failure = _remove_tree(build.path)
        if failure is None:
            removed.append(build)
        else:
            failures.append(failure[1])
            kept += build.size
    return removed, kept, failures


def _not_removed(failures: list[str], what: str) -> CliError:
    shown = "; ".join(failures[:_SHOWN_FAILURES])
    more = len(failures) - _SHOWN_FAILURES
    return CliError(
        f"could not remove {what}: {shown}" + (f" (and {more} more)" if more > 0 else "")
    )


# -- commands ----------------------------------------------------------------------------


def _tuning_stats_lines(stats: dict) -> list[str]:
    if not stats["exists"]:
        return [f"tuning database: {stats['path']} (none yet)"]
    lines = [
        f"tuning database: {stats['path']}",
        f"  entries: {stats['entries']} ({stats['current_version_entries']} of this version, "
        f"{stats['version']})",
        f"  hits: {stats['hits']}",
        f"  size: {_human(stats['bytes'])} ({stats['bytes']} bytes)",
    ]
    for field, title in (("templates", "templates"), ("archs", "architectures")):
        if stats[field]:
            counts = ", ".join(f"{name} {count}" for name, count in stats[field].items())
            lines.append(f"  {title}: {counts}")
    return lines


def _cmd_cache_stats(args: argparse.Namespace) -> int:
    root = _cache_root(args)
    kernels = _scan(root)
    if not args.json:
        # The kernel part first: it is still worth seeing when the database is unreadable.
        sizes = kernels["bytes_by_folder"]

        def folder(title: str, index: int, count: str) -> None:
            path = kernels["paths"][index]
            print(f"{title}: {path}")
            print(f"  {count} ({_human(sizes.get(os.path.basename(path), 0))})")

        folder("kernel cache", 0, f"libraries: {kernels['libraries']}")
        folder("cubin cache", 1, f"cubins: {kernels['cubins']}")
        folder("graph cache", 3, f"compiled graphs: {kernels['graphs']}")
        # Each is the cuda-emu runtime prelude precompiled by GCC (tens of MiB): one per
        # compiler, flags and prelude version, rebuilt in seconds when pruned.
        folder(
            "precompiled headers",
            2,
            f"cuda-emu runtime preludes precompiled by GCC (prelude.h.gch): "
            f"{kernels['precompiled_headers']}",
        )
        print(f"size of all builds: {_human(kernels['bytes'])} ({kernels['bytes']} bytes)")
    tuning = _database(args).stats()
    if args.json:
        _print_json({"cache_dir": root, "kernels": kernels, "tuning": tuning})
    else:
        print("\n".join(_tuning_stats_lines(tuning)))
    return 0


def _cmd_cache_list(args: argparse.Namespace) -> int:
    db = _database(args)
    records = db.records(template=args.template, arch=args.arch)
    if args.json:
        _print_json([record.to_json() for record in records])
        return 0
    if not records:
        print(f"no tuning records in {db.path}" + ("" if db.exists() else " (none yet)"))
        return 0
    header = ("KEY", "TEMPLATE", "ARCH", "TIME(us)", "HITS", "LAST USED", "SIGNATURE")
    rows = [header]
    for r in records:
        time_us = "-" if r.time_us is None else f"{r.time_us:.2f}"
        signature = r.signature + (f" | {r.fusion}" if r.fusion else "")
        if r.version != database.current_version():
            signature += f"  (minicomp {r.version})"
        rows.append(
            (r.key, r.template, r.arch, time_us, str(r.hits), _when(r.last_used), signature)
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    for row in rows:
        print("  ".join([cell.ljust(w) for cell, w in zip(row, widths)] + [row[-1]]))
    stale = sum(r.version != database.current_version() for r in records)
    note = f", {stale} of other minicomp versions (never used by this one)" if stale else ""
    print(f"{len(records)} record{'' if len(records) == 1 else 's'}{note}")
    return 0


def _cmd_cache_graphs(args: argparse.Namespace) -> int:
    kept = graph_cache.entries(_cache_root(args))
    if args.json:
        _print_json(kept)
        return 0
    if not kept:
        print(f"no compiled graphs in {os.path.join(_cache_root(args), graph_cache.KIND)}")
        return 0
    header = ("KEY", "KIND", "TARGET", "ATEN OPS", "KERNELS", "ATEN CALLS", "SIZE", "LAST USED")
    rows = [header]
    for e in kept:
        counts = (e.get("aten ops"), e.get("kernels"), e.get("aten calls"))
        rows.append(
            (
                e["key"][:16],
                str(e.get("kind", "?")),
                str(e.get("target", "?")),
                *("?" if c is None else str(c) for c in counts),
                _human(e["bytes"]),
                _when(e["used"]),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    total = sum(e["bytes"] for e in kept)
    print(f"{len(kept)} compiled graph{'' if len(kept) == 1 else 's'} ({_human(total)})")
    return 0


def _cmd_cache_show(args: argparse.Namespace) -> int:
    db = _database(args)
    if not db.exists():
        raise CliError(f"no tuning database at {db.path}: nothing has been tuned yet")
    matches = db.find(args.key)
    if not matches:
        raise CliError(
            f"no tuning record with key {args.key!r} in {db.path}; "
            "`minicomp cache list` shows the keys"
        )
    if len(matches) > 1:
        keys = ", ".join(r.key for r in matches[:10])
        raise CliError(f"key prefix {args.key!r} matches {len(matches)} records: {keys}")
    record = matches[0]
    if args.json:
        _print_json(record.to_json())
        return 0
    for name, value in record.to_json().items():
        if name == "config":
            value = json.dumps(value, sort_keys=True)
        elif name in ("created", "last_used"):
            value = f"{_when(value)} ({value:.0f})"
        print(f"{name + ':':16}{value}")
    return 0


def _clear_kernels(root: str) -> dict[str, object]:
    """Remove every build but those in progress: the usage removed, what could not be removed
    ("failures") and its usage ("left")."""
    doomed = [os.path.join(root, kind) for kind in (*_BUILD_KINDS, build_cache.QUARANTINE)]
    doomed += [e.path for e in _folders(root) if e.name.startswith(_REMOVING)]
    before = _scan(root, doomed)
    stayed = [f for f in map(_remove_tree, doomed) if f is not None]
    counts = ("libraries", "cubins", "graphs", "bytes")
    left = _scan(root, [folder for folder, _ in stayed])
    left = {k: left[k] for k in counts}
    removed = {k: before[k] - left[k] for k in counts}
    failures = [failure for _, failure in stayed]
    return {"paths": before["paths"], **removed, "failures": failures, "left": left}


def _clear_tuning(db: database.TuningDatabase) -> dict[str, object]:
    try:
        return {"path": db.path, "records": db.clear(), "corrupt": False}
    except database.TuningDatabaseError:
        # Exactly the case this command is the cure for: delete the unreadable file.
        return {"path": db.path, "records": None, "corrupt": True, "bytes": db.remove_files()}


def _cmd_cache_clear(args: argparse.Namespace) -> int:
    root = _cache_root(args)
    db = _database(args)
    which = args.which or "kernels"
    result: dict[str, object] = {"cache_dir": root}
    lines = []
    usage = None
    if which in ("kernels", "all"):
        usage = result["kernels"] = _clear_kernels(root)
        lines.append(
            f"removed {usage['libraries']} libraries, {usage['cubins']} cubins and "
            f"{usage['graphs']} compiled graphs ({_human(usage['bytes'])}) from "
            f"{', '.join(usage['paths'])}"
        )
    if which in ("tuning", "all"):
        tuning = result["tuning"] = _clear_tuning(db)
        if tuning["corrupt"]:
            lines.append(f"removed the unreadable tuning database {db.path}")
        else:
            lines.append(f"removed {tuning['records']} tuning records from {db.path}")
        if which == "tuning":
            # A compiled graph holds the decisions it was tuned to: it goes with them.
            graphs = os.path.join(root, graph_cache.KIND)
            count = _scan(root, [graphs])["graphs"]
            if _remove_tree(graphs) is None and count:
                lines.append(f"removed {count} compiled graphs, which hold tuning decisions")
    else:
        with contextlib.suppress(database.TuningDatabaseError):
            kept = db.stats()["entries"]
            if kept:
                lines.append(
                    f"kept {kept} tuning records ({db.path}); "
                    "`minicomp cache clear --tuning` removes them"
                )
    if args.json:
        _print_json(result)
    else:
        print("\n".join(lines))
    if usage is not None and usage["failures"]:
        left = usage["left"]
        what = (
            f"{left['libraries']} libraries and {left['cubins']} cubins ({_human(left['bytes'])})"
        )
        raise _not_removed(usage["failures"], what)
    return 0


def _cmd_cache_prune(args: argparse.Namespace) -> int:
    if args.older_than is None and args.max_size is None:
        raise CliError("cache prune needs --older-than AGE and/or --max-size SIZE")
    older_than = None if args.older_than is None else parse_duration(args.older_than)
    max_bytes = None if args.max_size is None else parse_size(args.max_size)
    root = _cache_root(args)
    db = _database(args)
    now = time.time()
    # Tuning records are costly to redo and small: they only go when old or when they alone
    # exceed the size; the kernel builds get what room the database leaves.
    records = db.prune(older_than_s=older_than, max_bytes=max_bytes, now=now)
    budget = None if max_bytes is None else max(0, max_bytes - db.file_bytes())
    builds, kept, failures = _prune_builds(root, older_than, budget, now)
    freed = sum(build.size for build in builds)
    if args.json:
        _print_json(
            {
                "cache_dir": root,
                "kernels": {
                    "removed": [b.path for b in builds],
                    "removed_bytes": freed,
                    "bytes_left": kept,
                    "failures": failures,
                },
                "tuning": {
                    "path": db.path,
                    "removed": [r.to_json() for r in records],
                    "bytes_left": db.file_bytes(),
                },
            }
        )
    else:
        print(f"removed {len(builds)} kernel builds ({_human(freed)}); {_human(kept)} left")
        print(f"removed {len(records)} tuning records from {db.path}")
        for r in records:
            used = _when(r.last_used)
            print(f"  {r.key}  {r.template}  {r.arch}  last used {used}  {r.signature}")
    if failures:
        raise _not_removed(failures, f"{len(failures)} kernel builds")
    return 0


def _is_bundle_name(path: str) -> bool:
    return path.endswith((".tar.gz", ".tgz"))


def _cmd_cache_export(args: argparse.Namespace) -> int:
    if _is_bundle_name(args.file):
        return _export_bundle(args)
    db = _database(args)
    if not db.exists():
        raise CliError(f"no tuning database at {db.path}: nothing to export")
    try:
        count = db.export(args.file, template=args.template, arch=args.arch)
    except OSError as err:
        raise CliError(f"cannot write {args.file}: {err.strerror}") from None
    if args.json:
        _print_json({"file": os.path.abspath(args.file), "records": count})
    else:
        print(f"exported {count} tuning records from {db.path} to {args.file}")
    return 0


def _export_bundle(args: argparse.Namespace) -> int:
    from minicomp.tune import bundle

    if args.template or args.arch:
        raise CliError("--template and --arch select records for a JSON export, not a bundle")
    try:
        manifest = bundle.write_bundle(_cache_root(args), args.file)
    except OSError as err:
        raise CliError(f"cannot write {args.file}: {err.strerror or err}") from None
    if args.json:
        _print_json({"file": os.path.abspath(args.file), **manifest})
    else:
        print(
            f"bundled {manifest['records']} tuning records and {manifest['cubins']} cubins "
            f"({_human(manifest['cubin_bytes'])}) from {_cache_root(args)} into {args.file}"
        )
    return 0


def _cmd_cache_import(args: argparse.Namespace) -> int:
    from minicomp.tune import bundle

    try:
        is_bundle = bundle.is_bundle(args.file)
    except OSError as err:
        raise CliError(f"cannot read {args.file}: {err.strerror}") from None
    if is_bundle:
        try:
            counts = bundle.read_bundle(args.file, _cache_root(args))
        except (bundle.BundleError, build_cache.CacheError) as err:
            raise CliError(str(err)) from None
        added, replaced, skipped = counts["added"], counts["replaced"], counts["skipped"]
    else:
        db = _database(args)
        added, replaced, skipped = db.import_(args.file)
        counts = {"added": added, "replaced": replaced, "skipped": skipped}
    if args.json:
        _print_json({"file": os.path.abspath(args.file), **counts})
    else:
        cubins = f"; {counts['cubins']} cubins added" if is_bundle else ""
        if counts.get("cubins_refused"):
            cubins += f", {counts['cubins_refused']} refused (not matching their hashes)"
        print(
            f"imported {args.file} into {_cache_root(args)}: {added} added, {replaced} replaced "
            f"by newer records, {skipped} skipped (the local record is as new or newer){cubins}"
        )
    return 0


def _add_cache_parser(commands: argparse._SubParsersAction) -> None:
    # --cache-dir and --json are accepted before and after the action; SUPPRESS keeps an
    # action's parser from overwriting a value given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--cache-dir", default=argparse.SUPPRESS, help="cache root (default: the cache_dir option)"
    )
    json_flag = argparse.ArgumentParser(add_help=False)
    json_flag.add_argument("--json", action="store_true", help="print JSON, for scripts")
    filters = argparse.ArgumentParser(add_help=False)
    filters.add_argument("--template", help="only this template's records")
    filters.add_argument("--arch", help="only this architecture's records (sm_90, cpu...)")

    cache = commands.add_parser(
        "cache",
        help="inspect and manage the caches: compiled kernels and tuning records",
        description=_CACHE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cache.add_argument(
        "--cache-dir", default=None, help="cache root (default: the cache_dir option)"
    )
    actions = cache.add_subparsers(dest="cache_command", required=True, metavar="ACTION")

    def action(name, func, text, parents=()):
        sub = actions.add_parser(name, help=text, parents=[common, *parents], description=text)
        sub.set_defaults(func=func)
        return sub

    action("list", _cmd_cache_list, "list the tuning records", [filters, json_flag])
    action(
        "graphs",
        _cmd_cache_graphs,
        "list the compiled graphs kept, most recently used first",
        [json_flag],
    )
    show = action("show", _cmd_cache_show, "show one tuning record", [json_flag])
    show.add_argument("key", metavar="KEY", help="a record's key, or a unique prefix of it")
    action(
        "stats",
        _cmd_cache_stats,
        "count the kernel builds and tuning records, their sizes and hits",
        [json_flag],
    )
    clear = action(
        "clear", _cmd_cache_clear, "delete kernel builds and/or tuning records", [json_flag]
    )
    which = clear.add_mutually_exclusive_group()
    for flag, text in (
        ("kernels", "compiled libraries and cubins (the default)"),
        ("tuning", "tuning records (a corrupt database file is deleted)"),
        ("all", "both"),
    ):
        which.add_argument(f"--{flag}", dest="which", action="store_const", const=flag, help=text)
    prune = action(
        "prune",
        _cmd_cache_prune,
        "delete old kernel builds and tuning records, or the oldest beyond a size",
        [json_flag],
    )
    prune.add_argument(
        "--older-than",
        metavar="AGE",
        help="kernel builds built and tuning records last used "
        "longer ago than AGE: 90s, 45m, 12h, 30d, 2w",
    )
    prune.add_argument(
        "--max-size",
        metavar="SIZE",
        help="then the oldest until the cache fits in SIZE: 500M, "
        "2G, 100K (binary units); tuning records go only when they alone exceed it",
    )
    export = action(
        "export",
        _cmd_cache_export,
        "write tuning records to a JSON file, or with the cubins to a FILE.tar.gz bundle",
        [filters, json_flag],
    )
    export.add_argument("file", metavar="FILE")
    imp = action(
        "import",
        _cmd_cache_import,
        "merge tuning records (and a bundle's cubins) from an exported file (the newer of two "
        "records wins)",
        [json_flag],
    )
    imp.add_argument("file", metavar="FILE")


_CACHE_DESCRIPTION = """\
Inspect and manage minicomp's on-disk caches under the cache directory (--cache-dir, else
$MINICOMP_CACHE_DIR, else ~/.cache/minicomp):

  kernels/, cubins/   compiled kernel builds (shared libraries, NVRTC cubins); cheap to redo
  headers/            precompiled headers the cuda-emu builds include; cheap to redo
  graphs/             compiled graphs (each graph's IR after minicomp's passes and its kernel
                      functions), so that compiling a graph again skips minicomp's work
  building/           builds in progress and their locks: `clear` and `prune` leave them alone
  quarantine/         damaged builds moved aside (and built again), kept for a look
  tuning.sqlite       the tuning database: the parameters each template tuned to

The root must belong to you and be writable by no one else: minicomp refuses to load builds
from one that is not. `clear` and `prune` exit with status 1, naming what stayed, when they
cannot remove something.

`clear` with no flag removes the kernel builds and compiled graphs only: tuning records cost
minutes of benchmarking to redo (`clear --tuning` takes the compiled graphs too, as they hold
the decisions tuning made). `export` and `import` ship tuning records to a machine with the
same GPU; exported to FILE.tar.gz, the bundle also carries the compiled cubins.
"""


def _cmd_config(args: argparse.Namespace) -> int:
    print(config.describe(markdown=args.markdown), end="")
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    # Imported lazily: explaining pulls in torch and the whole compiler.
    from minicomp.explain import ScriptError, explain_file

    if not os.path.isfile(args.script):
        raise CliError(f"no such script: {args.script}")
    try:
        explanation = explain_file(args.script, list(args.script_args))
    except ScriptError as err:
        print(f"minicomp: error: {err}\n{err.tail}", file=sys.stderr)
        return 1
    print(explanation)
    if args.ir:
        print("\n" + explanation.ir())
    if args.source:
        print("\n" + explanation.source())
    if args.pass_name is not None:
        try:
            text = explanation.after_pass(args.pass_name)
        except ValueError as err:
            raise CliError(str(err)) from None
        print("\n" + text)
    if args.out is not None:
        written = explanation.write(args.out)
        top = list(dict.fromkeys(os.path.relpath(p, args.out).split(os.sep)[0] for p in written))
        folders = [t + "/" for t in top if not os.path.isfile(os.path.join(args.out, t))]
        files = [t for t in top if os.path.isfile(os.path.join(args.out, t))]
        where = f", a folder per graph ({folders[0]} ... {folders[-1]})" if folders else ""
        print(f"\nwrote {len(written)} files under {args.out}: {', '.join(files)}{where}")
    return 0


def _cmd_profile(args: argparse.Namespace) -> int:
    import os

    # Imported lazily: profiling pulls in torch and the whole compiler.
    from minicomp.lens.devices import DEVICES
    from minicomp.profile import profile_file

    if args.device not in DEVICES:
        raise CliError(f"unknown device {args.device!r}; known: {', '.join(DEVICES)}")
    if not os.path.isfile(args.script):
        raise CliError(f"no such script: {args.script}")
    result = profile_file(args.script, list(args.script_args), device=args.device)
    if not result.graph.kernels:
        print("minicomp ran no kernels in this script", file=sys.stderr)
        return 1
    print(result.json() if args.json else result)
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from minicomp.bench import runner

    try:
        settings = runner.settings_from_args(args)
    except ValueError as err:
        raise CliError(str(err)) from None
    runner.run(settings)
    return 0


def _add_bench_parser(commands: argparse._SubParsersAction) -> None:
    from minicomp.bench import options

    bench = commands.add_parser(
        "bench",
        help="time the model suite under eager, Inductor, minicomp (and Hidet)",
        description=_BENCH_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options.add_arguments(bench)
    bench.set_defaults(func=_cmd_bench)


_BENCH_DESCRIPTION = """\
Build the model suite (ResNet-50, BERT-base, GPT-2, a 1B LLaMA, ViT-B/16, a T5 encoder, with
random weights from installed packages) and, for each model, dtype and batch size, run every
backend on the same inputs: check it against eager, weigh its peak memory and compile time
(cold and with a warm cache), and time all backends together in rounds, each round calling
every one once. A speed-up is the median of the per-round ratios, printed with its
interquartile range and marked ! when the rounds spread too widely. Prints a table, writes a
JSON file and, with matplotlib (pip install 'minicomp[bench]'), a PNG chart of speed-ups.
docs/bench.md explains every column.
"""


_EXPLAIN_DESCRIPTION = """\
Run a Python script and summarise every graph minicomp compiles in it: the frame Dynamo found
it in, the ATen ops in it, the kernels out, the calls it makes to ATen grouped by why (by
design, views, unsupported...), the graph cache and the compile time of each stage; then
Dynamo's graph breaks (source line and reason), its recompiles (the guard failures) and the
total compile time. The options ask for more; they come before SCRIPT.py, whose own
arguments follow it.
"""


_PROFILE_DESCRIPTION = """\
Run a Python script with every model minicomp compiles built for cuda-emu with the performance
lens: each kernel launch runs in the emulator and counts, for a sample of its blocks, the
sectors of its global accesses, its shared-memory wavefronts, its tensor-core and other
instructions; NVRTC gives its registers, shared memory and spills. Prints each launch's
estimated time on the device (a roofline model whose assumptions it prints), slowest first.
The script's tensors must be on the CPU.
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minicomp", description=__doc__)
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    explain = commands.add_parser(
        "explain",
        help="show what minicomp does to a script's models",
        description=_EXPLAIN_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    explain.add_argument(
        "--ir", action="store_true", help="also print each graph's final IR and kernel IR"
    )
    explain.add_argument(
        "--source", action="store_true", help="also print the generated source of each graph"
    )
    explain.add_argument(
        "--pass", dest="pass_name", metavar="NAME", help="also print the graph IR after pass NAME"
    )
    explain.add_argument(
        "--out", metavar="DIR", help="write every stage of every graph as files under DIR"
    )
    explain.add_argument("script", metavar="SCRIPT.py")
    explain.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS")
    explain.set_defaults(func=_cmd_explain)

    prof = commands.add_parser(
        "profile",
        help="estimate each kernel of a script's models on a GPU, without one",
        description=_PROFILE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    prof.add_argument("--device", default="h100", help="h100 (default), h200 or a100")
    prof.add_argument("--json", action="store_true", help="print the profile as JSON")
    prof.add_argument("script", metavar="SCRIPT.py")
    prof.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS")
    prof.set_defaults(func=_cmd_profile)

    show = commands.add_parser("config", help="list every option, its default and env variable")
    show.add_argument("--markdown", action="store_true", help="print a Markdown table")
    show.set_defaults(func=_cmd_config)

    _add_cache_parser(commands)
    _add_bench_parser(commands)
    return parser


def _version() -> str:
    """minicomp's version and the PyTorch it runs with, without importing torch (slow)."""

    def installed(package: str) -> str:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return "not installed"

    python = sys.version.split()[0]
    return f"minicomp {installed('minicomp')} (torch {installed('torch')}, Python {python})"


def _usage_of_subcommands(parser: argparse.ArgumentParser) -> None:
    """Make every subcommand's parser record itself, so an error names its usage."""
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        for sub in action.choices.values():
            sub.set_defaults(_parser=sub)
            _usage_of_subcommands(sub)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `minicomp` command with ``argv`` (default: ``sys.argv[1:]``); return its status."""
    parser = _parser()
    _usage_of_subcommands(parser)
    # argparse reports an unknown option of a subcommand with the top level's usage; the
    # subcommand that received it reports it here instead, with its own usage.
    args, extra = parser.parse_known_args(argv)
    if extra:
        getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.func(args)
    except (CliError, database.TuningDatabaseError) as err:
        print(f"minicomp: error: {err}", file=sys.stderr)
        return 1
    except NotImplementedError as err:
        print(f"minicomp: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
