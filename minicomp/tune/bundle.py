"""A cache bundle: one .tar.gz holding a cache's tuning records and its NVRTC cubins, to carry
tuning and compiles to another machine with the same GPU (or to the next stage of a staged
GPU run), where importing it merges both into that machine's cache.

Layout: `minicomp-bundle.json` (what is inside), `tuning.json` (an export of the tuning
database, see database.py) and `cubins/<key[:2]>/<key>/{kernel.cubin, meta.json, source.cu}`,
the cubin cache's own layout. Host builds (the cpu target's and the emulator's shared
libraries) stay out: they are specific to the host that built them. A cubin is imported only
when it matches the hashes its meta.json records (backends/cache.py), as a cached one is
used only then; the tuning records are checked as any export's are.
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
import tempfile
import time
import warnings

from minicomp.backends import cache
from minicomp.tune.database import TuningDatabase, default_path

FORMAT = "minicomp-cache-bundle"
FORMAT_VERSION = 1
MANIFEST = "minicomp-bundle.json"
TUNING = "tuning.json"
_CUBIN_ENTRY = re.compile(
    r"cubins/([0-9a-f]{2})/(\1[0-9a-f]{62})/(kernel\.cubin|meta\.json|source\.cu)"
)
_PRODUCT = "kernel.cubin"


class BundleError(ValueError):
    """A file is not a cache bundle minicomp can import; nothing was imported."""


def is_bundle(path: str | os.PathLike) -> bool:
    """Whether `path` is a gzip file (a bundle, as opposed to a JSON export)."""
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def _cubin_entries(cache_dir: str) -> list[tuple[str, int]]:
    """(directory relative to the cache, bytes) of every complete cubin entry, newest first."""
    root = os.path.join(cache_dir, "cubins")
    entries = []
    for fan in sorted(os.listdir(root)) if os.path.isdir(root) else ():
        for key in sorted(os.listdir(os.path.join(root, fan))):
            folder = os.path.join(root, fan, key)
            if key.startswith(".") or not os.path.isfile(os.path.join(folder, _PRODUCT)):
                continue
            files = [os.path.join(folder, n) for n in os.listdir(folder)]
            size = sum(os.path.getsize(p) for p in files if os.path.isfile(p))
            mtime = os.path.getmtime(os.path.join(folder, _PRODUCT))
            entries.append((os.path.relpath(folder, cache_dir), size, mtime))
    entries.sort(key=lambda e: -e[2])
    return [(rel, size) for rel, size, _ in entries]


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
    tar.addfile(info, io.BytesIO(data))


def write_bundle(cache_dir: str, path: str, *, max_bytes: int = 48 << 20) -> dict:
    """Bundle the tuning records and the newest cubins of `cache_dir` (until `max_bytes` of
    cubin entries) into `path`, atomically; returns the manifest."""
    cache_dir = os.path.abspath(os.path.expanduser(cache_dir))
    db = TuningDatabase(default_path(cache_dir))
    with tempfile.TemporaryDirectory(prefix="minicomp-bundle-") as scratch:
        records = 0
        tuning_file = os.path.join(scratch, TUNING)
        if db.exists():
            records = db.export(tuning_file)
        chosen, total = [], 0
        for rel, size in _cubin_entries(cache_dir):
            if total + size <= max_bytes:
                chosen.append(rel)
                total += size
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "created": time.time(),
            "records": records,
            "cubins": len(chosen),
            "cubin_bytes": total,
        }
        path = os.path.abspath(path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-bundle-", dir=os.path.dirname(path))
        os.close(fd)
        try:
            with tarfile.open(tmp, "w:gz") as tar:
                _add_bytes(tar, MANIFEST, json.dumps(manifest, indent=1).encode())
                if records:
                    tar.add(tuning_file, arcname=TUNING)
                for rel in chosen:
                    for name in sorted(os.listdir(os.path.join(cache_dir, rel))):
                        tar.add(os.path.join(cache_dir, rel, name), arcname=f"{rel}/{name}")
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    return manifest


def read_bundle(path: str, cache_dir: str) -> dict:
    """Merge the bundle at `path` into `cache_dir`: its tuning records (the newer of two
    records wins) and its cubins (an entry already there is kept). Returns counts; raises
    BundleError, importing nothing, when the file is not a bundle or holds anything else."""
    cache_dir = os.path.abspath(os.path.expanduser(cache_dir))
    try:
        tar = tarfile.open(path, "r:gz")
    except (tarfile.TarError, OSError, EOFError) as err:
        raise BundleError(f"{path} is not a minicomp cache bundle: {err}") from None
    with tar, tempfile.TemporaryDirectory(prefix="minicomp-bundle-") as scratch:
        entries: dict[str, dict[str, bytes]] = {}
        manifest = tuning = None
        try:
            members = tar.getmembers()
            for member in members:
                if not member.isfile():
                    raise BundleError(f"{path}: {member.name!r} is not a regular file")
                data = tar.extractfile(member).read()
                if member.name == MANIFEST:
                    manifest = json.loads(data)
                elif member.name == TUNING:
                    tuning = data
                elif m := _CUBIN_ENTRY.fullmatch(member.name):
                    entries.setdefault(f"cubins/{m[1]}/{m[2]}", {})[m[3]] = data
                else:
                    raise BundleError(f"{path}: unexpected member {member.name!r}")
        except (tarfile.TarError, OSError, EOFError, ValueError, RecursionError) as err:
            if isinstance(err, BundleError):
                raise
            raise BundleError(f"{path} is damaged: {err}") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise BundleError(f"{path} has no {MANIFEST} of format {FORMAT!r}")
        if manifest.get("format_version") != FORMAT_VERSION:
            raise BundleError(f"{path} is bundle version {manifest.get('format_version')}")
        checked = _checked_entries(path, entries)
        cache_dir = cache.trusted_root(cache_dir)
        added = replaced = skipped = 0
        if tuning is not None:
            tuning_file = os.path.join(scratch, TUNING)
            with open(tuning_file, "wb") as f:
                f.write(tuning)
            added, replaced, skipped = TuningDatabase(default_path(cache_dir)).import_(tuning_file)
        cubins = 0
        for rel, (files, meta) in checked.items():
            final = os.path.join(cache_dir, rel)
            if cache.lookup(cache_dir, final, _PRODUCT) is not None:
                continue
            with cache.build_dir(cache_dir, "import") as tmp:
                for name, data in files.items():
                    with open(os.path.join(tmp, name), "wb") as f:
                        f.write(data)
                cache.publish(tmp, final, meta)
            cubins += 1
    refused = len(entries) - len(checked)
    return {
        "added": added,
        "replaced": replaced,
        "skipped": skipped,
        "cubins": cubins,
        "cubins_refused": refused,
    }


def _checked_entries(path: str, entries: dict[str, dict[str, bytes]]) -> dict:
    """rel -> (files but meta.json, meta.json less its hashes) of the cubin entries that match
    the hashes their meta.json records; the others are left out with a warning."""
    checked = {}
    for rel, files in entries.items():
        try:
            if _PRODUCT not in files:
                raise cache.DamagedEntry(f"no {_PRODUCT}")
            meta = cache.verify_contents(files)
        except cache.DamagedEntry as err:
            warnings.warn(
                f"minicomp: {path}: cubin entry {rel} not imported: {err}",
                cache.CacheIntegrityWarning,
                stacklevel=3,
            )
            continue
        rest = {k: v for k, v in meta.items() if k != "files"}
        checked[rel] = ({n: d for n, d in files.items() if n != cache.META_NAME}, rest)
    return checked
