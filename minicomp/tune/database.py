"""The tuning database: one SQLite file that remembers the parameters each template tuned to.

A record is keyed by (template, operator signature, fusion signature, architecture, minicomp
version) and holds the winning parameters as a JSON object, the winner's measured time and
what the search cost. The file is `<cache_dir>/tuning.sqlite`. It runs in WAL mode with a busy
timeout, and every write is one short `BEGIN IMMEDIATE` transaction, so several processes can
tune and store at once: readers never block, writers queue for the lock.

Which call to use where:

- The compiler calls :meth:`TuningDatabase.safe_lookup` and :meth:`TuningDatabase.safe_store`.
  When the file is corrupt, locked for too long or unwritable they warn once per file and
  carry on without it (a lookup finds nothing, a store is dropped): a cache must never fail a
  compilation.
- The `minicomp cache` command, tools and tests call the other methods, which raise
  :class:`TuningDatabaseError` naming the file and how to recover.

Records of another minicomp version stay in the file (``minicomp cache prune`` ages them out)
but :meth:`~TuningDatabase.lookup` never returns them. The ``meta`` table holds the schema
version, so a later minicomp can migrate the file (``_MIGRATIONS``) or refuse it clearly.

Records are data, not trust: one read from the file or an export is checked field by field
(plain JSON config, integers SQLite can hold), its search-space level capped at the largest
there is and its timestamps at the present; a damaged one is skipped with a
:class:`TuningRecordWarning`, and so is one the caller's ``valid`` check refuses.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import math
import os
import reprlib
import sqlite3
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from minicomp import config

FILE_NAME = "tuning.sqlite"
SCHEMA_VERSION = 1
TUNING_VERSION = "1"
"""Part of every record's version: bump it when what the tuner stores changes meaning (a new
parameter, a different timing method) without a new minicomp release."""
EXPORT_FORMAT = "minicomp-tuning"
EXPORT_FORMAT_VERSION = 1
BUSY_TIMEOUT_S = 30.0
KEY_LENGTH = 16

_COLUMNS = (
    "key",
    "template",
    "signature",
    "fusion",
    "arch",
    "version",
    "config",
    "time_us",
    "candidates",
    "tuning_seconds",
    "created",
    "last_used",
    "hits",
)
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM records"
_SCHEMA = (
    "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE records (
        key TEXT PRIMARY KEY,
        template TEXT NOT NULL,
        signature TEXT NOT NULL,
        fusion TEXT NOT NULL,
        arch TEXT NOT NULL,
        version TEXT NOT NULL,
        config TEXT NOT NULL,
        time_us REAL,
        candidates INTEGER NOT NULL,
        tuning_seconds REAL NOT NULL,
        created REAL NOT NULL,
        last_used REAL NOT NULL,
        hits INTEGER NOT NULL
    )""",
    "CREATE INDEX records_by_template ON records (template, arch)",
    "CREATE INDEX records_by_last_used ON records (last_used)",
)
# What one record costs, for pruning to a size: its text plus a fixed allowance for the key,
# the numbers and SQLite's per-row bookkeeping.
_ROW_BYTES_SQL = (
    "64 + length(CAST(template AS BLOB)) + length(CAST(signature AS BLOB))"
    " + length(CAST(fusion AS BLOB)) + length(CAST(arch AS BLOB))"
    " + length(CAST(version AS BLOB)) + length(CAST(config AS BLOB))"
)
# Statements taking the file from schema version N to N + 1, applied in order when opened.
_MIGRATIONS: dict[int, tuple[str, ...]] = {}
_CLEAR_HINT = "remove it with `minicomp cache clear --tuning`"
LEVEL_KEY = "_search_space"
"""The config key where the tuner (tune/tuner.py) stores the search space a record was tuned
at: a record counts for that level and every smaller one."""
MAX_LEVEL = 2
"""The largest search space (the search_space option's largest choice; a test checks it)."""
_INT_LIMIT = 2**63  # SQLite's INTEGER is 64-bit
_CONFIG_DEPTH = 4
_brief = reprlib.Repr()
_brief.maxlevel, _brief.maxstring, _brief.maxother = 3, 60, 60
_short = _brief.repr


class TuningDatabaseError(RuntimeError):
    """The tuning database cannot be used: corrupt, of another schema, locked, unwritable."""

    def __init__(self, message: str, path: str):
        super().__init__(message)
        self.path = path


class ExportFileError(TuningDatabaseError):
    """A file given to :meth:`TuningDatabase.import_` is not a valid tuning export."""


class TuningRecordWarning(RuntimeWarning):
    """A tuning record was skipped: it is damaged, or its template cannot use its config."""


@functools.lru_cache(maxsize=1)
def current_version() -> str:
    """The version every new record carries: minicomp's package version and TUNING_VERSION."""
    try:
        package = importlib.metadata.version("minicomp")
    except importlib.metadata.PackageNotFoundError:
        package = "unknown"
    return f"{package}+tuning{TUNING_VERSION}"


def default_path(cache_dir: str | os.PathLike | None = None) -> str:
    """The database file under ``cache_dir`` (default: the cache_dir option), ~ expanded."""
    root = config.get("cache_dir") if cache_dir is None else os.fspath(cache_dir)
    return os.path.join(os.path.abspath(os.path.expanduser(root)), FILE_NAME)


def record_key(template: str, signature: str, fusion: str, arch: str, version: str) -> str:
    """The short stable key of a record: a SHA-256 prefix of its length-prefixed key fields."""
    h = hashlib.sha256()
    for part in (template, signature, fusion, arch, version):
        data = part.encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()[:KEY_LENGTH]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) < _INT_LIMIT


def _is_number(value: Any) -> bool:
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))


def _is_plain(value: Any, depth: int = 0) -> bool:
    """Whether a config value is what a template config holds: numbers, strings, booleans and
    null, in lists and objects a few levels deep."""
    if depth > _CONFIG_DEPTH:
        return False
    if value is None or isinstance(value, (bool, str)):
        return True
    if isinstance(value, (int, float)):
        return _is_number(value)
    if isinstance(value, (list, tuple)):
        return all(_is_plain(v, depth + 1) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _is_plain(v, depth + 1) for k, v in value.items())
    return False


def _is_config(value: Any) -> bool:
    return isinstance(value, Mapping) and _is_plain(value) and _is_int(value.get(LEVEL_KEY, 0))


@dataclass(frozen=True)
class Record:
    """One tuned decision: its key fields, the chosen parameters and what finding them cost.

    ``config`` is normalized through JSON on construction (tuples become lists), so a record
    compares equal to itself after a trip through the database or an export file.
    ``time_us`` is None for a heuristic pick that was never measured. ``last_used`` defaults
    to ``created``.
    """

    template: str
    signature: str
    fusion: str
    arch: str
    config: dict[str, Any]
    time_us: float | None = None
    candidates: int = 0
    tuning_seconds: float = 0.0
    version: str = field(default_factory=current_version)
    created: float = field(default_factory=time.time)
    last_used: float | None = None
    hits: int = 0

    def __post_init__(self) -> None:
        for name in ("template", "signature", "fusion", "arch", "version"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"Record.{name} must be a str, got {getattr(self, name)!r}")
        if not isinstance(self.config, Mapping):
            raise TypeError(f"Record.config must be a mapping, got {_short(self.config)}")
        if not _is_plain(self.config):
            raise TypeError(
                f"Record.config must be JSON-serializable numbers, strings and lists a few "
                f"levels deep: {_short(self.config)}"
            )
        try:
            normalized = json.loads(json.dumps(dict(self.config), sort_keys=True))
        except (TypeError, ValueError) as err:
            raise TypeError(f"Record.config must be JSON-serializable: {err}") from None
        object.__setattr__(self, "config", normalized)
        if self.last_used is None:
            object.__setattr__(self, "last_used", self.created)

    @property
    def key(self) -> str:
        """The record's short stable key (what `minicomp cache show` takes)."""
        return record_key(self.template, self.signature, self.fusion, self.arch, self.version)

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON object, its key first."""
        return {"key": self.key, **dataclasses.asdict(self)}

    @classmethod
    def from_json(cls, data: Any) -> Record:
        """A record from :meth:`to_json`'s output; raises ValueError naming a bad field."""
        if not isinstance(data, Mapping):
            raise ValueError(f"expected a JSON object, got {type(data).__name__}")
        checks = {
            "template": lambda v: isinstance(v, str),
            "signature": lambda v: isinstance(v, str),
            "fusion": lambda v: isinstance(v, str),
            "arch": lambda v: isinstance(v, str),
            "version": lambda v: isinstance(v, str),
            "config": _is_config,
            "time_us": lambda v: v is None or _is_number(v),
            "candidates": lambda v: _is_int(v) and v >= 0,
            "tuning_seconds": _is_number,
            "created": _is_number,
            "last_used": _is_number,
            "hits": lambda v: _is_int(v) and v >= 0,
        }
        for name, ok in checks.items():
            if name not in data:
                raise ValueError(f"missing field {name!r}")
            if not ok(data[name]):
                raise ValueError(f"bad value for {name!r}: {_short(data[name])}")
        return cls(**{name: data[name] for name in checks})

    def sane(self, now: float | None = None) -> Record:
        """This record with its level capped at MAX_LEVEL and its timestamps at ``now``
        (default: the present), so that no record claims a search it never made or stays
        newest forever."""
        now = time.time() if now is None else now
        changes: dict[str, Any] = {}
        level = self.config.get(LEVEL_KEY)
        if _is_int(level) and not 0 <= level <= MAX_LEVEL:
            changes["config"] = {**self.config, LEVEL_KEY: min(max(level, 0), MAX_LEVEL)}
        if self.created > now:
            changes["created"] = now
        if self.last_used > now:
            changes["last_used"] = now
        return dataclasses.replace(self, **changes) if changes else self


def _record(row: tuple) -> Record:
    """The checked record of a row; raises ValueError naming what is damaged."""
    values = dict(zip(_COLUMNS, row))
    del values["key"]
    try:
        values["config"] = json.loads(values["config"])
    except (TypeError, ValueError, RecursionError) as err:
        raise ValueError(f"bad config: {err}") from None
    return Record.from_json(values).sane()


def _row(record: Record) -> tuple:
    values = {"key": record.key, **dataclasses.asdict(record)}
    values["config"] = json.dumps(record.config, sort_keys=True)
    return tuple(values[name] for name in _COLUMNS)


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    # IMMEDIATE takes the write lock up front, waiting through the busy timeout; a deferred
    # transaction that reads and then writes can fail at once in WAL mode instead of waiting.
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


_inherited: list[sqlite3.Connection] = []
_warned_paths: set[str] = set()
_warned_lock = threading.Lock()


def _accepts(valid: Callable[[Record], bool], record: Record) -> bool:
    try:
        return bool(valid(record))
    except (TypeError, ValueError):  # a config its template's class cannot even hold
        return False


def read_export(path: str | os.PathLike) -> list[Record]:
    """The records of an export file; raises ExportFileError when it is not a valid export."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as err:
        raise ExportFileError(f"cannot read {path}: {err.strerror}", path) from None
    except RecursionError:
        message = f"{path} is not a tuning export: its JSON is nested too deeply"
        raise ExportFileError(message, path) from None
    except (ValueError, UnicodeDecodeError) as err:
        message = f"{path} is not a tuning export: invalid JSON ({err})"
        raise ExportFileError(message, path) from None
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        raise ExportFileError(
            f'{path} is not a tuning export (no "format": "{EXPORT_FORMAT}" field); '
            "make one with `minicomp cache export FILE`",
            path,
        )
    if data.get("format_version") != EXPORT_FORMAT_VERSION:
        raise ExportFileError(
            f"{path} is a tuning export of format version {data.get('format_version')!r}; "
            f"this minicomp reads version {EXPORT_FORMAT_VERSION}",
            path,
        )
    if not isinstance(data.get("records"), list):
        raise ExportFileError(f'{path}: "records" must be a list', path)
    records = []
    for index, item in enumerate(data["records"]):
        try:
            records.append(Record.from_json(item).sane())
        except (ValueError, TypeError) as err:
            raise ExportFileError(f"{path}: record {index}: {err}", path) from None
    return records


class TuningDatabase:
    """The tuning records in one SQLite file (default: ``<cache_dir>/tuning.sqlite``).

    Cheap to create, safe to share between threads (each thread gets its own connection, kept
    open) and to pickle. The file is created by the first write; reads of a missing file find
    nothing. SQLite's WAL mode needs a local file system: not NFS.
    """

    def __init__(self, path: str | os.PathLike | None = None, *, timeout: float = BUSY_TIMEOUT_S):
        self.path = default_path() if path is None else os.path.abspath(os.fspath(path))
        self.timeout = timeout
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "timeout": self.timeout}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], timeout=state["timeout"])

    def __repr__(self) -> str:
        return f"TuningDatabase({self.path!r})"

    def exists(self) -> bool:
        """Whether the database file exists (it may still be corrupt)."""
        return os.path.isfile(self.path)

    def files(self) -> list[str]:
        """The database file and SQLite's companions (WAL, shared memory) that exist."""
        names = [self.path + suffix for suffix in ("", "-wal", "-shm", "-journal")]
        return [name for name in names if os.path.isfile(name)]

    def file_bytes(self) -> int:
        """Bytes on disk of the database and its companion files."""
        total = 0
        for name in self.files():
            with contextlib.suppress(OSError):
                total += os.path.getsize(name)
        return total

    # -- connections and schema ------------------------------------------------------------

    def _error(self, err: Exception) -> TuningDatabaseError:
        text = str(err)
        if isinstance(err, OSError):
            return TuningDatabaseError(
                f"cannot create the tuning database {self.path}: {err.strerror}", self.path
            )
        if "locked" in text or "busy" in text:
            return TuningDatabaseError(
                f"the tuning database {self.path} stayed locked by another process for "
                f"{self.timeout:g} s ({text})",
                self.path,
            )
        if "not a database" in text or "malformed" in text:
            return TuningDatabaseError(
                f"the tuning database {self.path} is corrupt ({text}); {_CLEAR_HINT}", self.path
            )
        return TuningDatabaseError(
            f"cannot use the tuning database {self.path} ({text}); if it is damaged, {_CLEAR_HINT}",
            self.path,
        )

    def _wrong_schema(self, why: str) -> TuningDatabaseError:
        return TuningDatabaseError(
            f"{self.path} is not a minicomp tuning database of schema version {SCHEMA_VERSION} "
            f"({why}); {_CLEAR_HINT}",
            self.path,
        )

    @contextlib.contextmanager
    def _connect(self, *, create: bool) -> Iterator[sqlite3.Connection | None]:
        """This thread's connection, schema checked, or None when the file is missing and
        ``create`` is false; sqlite3 and OS errors become TuningDatabaseError."""
        if os.path.isdir(self.path):
            raise TuningDatabaseError(f"{self.path} is a directory, not a database", self.path)
        try:
            conn = self._connection(create)
        except (sqlite3.Error, OSError) as err:
            raise self._error(err) from err
        if conn is None:
            yield None
            return
        try:
            yield conn
        except sqlite3.Error as err:
            self._drop()
            raise self._error(err) from err

    def _connection(self, create: bool) -> sqlite3.Connection | None:
        # Connections stay open, one per thread: closing the last connection to a WAL file
        # checkpoints and deletes the WAL, which made every call cost milliseconds.
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            self._drop()
            if not create:
                return None
            os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
            stat = None
        local = self._local
        conn = getattr(local, "conn", None)
        # Reopen after a fork, or when another process deleted or replaced the file.
        if conn is not None and stat is not None:
            if local.identity == (os.getpid(), stat.st_dev, stat.st_ino):
                return conn
        self._drop()
        conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
        try:
            stat = os.stat(self.path)
            self._ensure_schema(conn)
            # WAL keeps the file consistent on a crash with NORMAL; only the newest commits
            # can be lost on power failure, which for a cache is fine.
            conn.execute("PRAGMA synchronous = NORMAL")
        except BaseException:
            conn.close()
            raise
        local.conn, local.identity = conn, (os.getpid(), stat.st_dev, stat.st_ino)
        return conn

    def _drop(self) -> None:
        """Forget this thread's connection: closed if this process opened it, else kept
        unclosed (SQLite forbids using a connection inherited through fork, closing too)."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            return
        if self._local.identity[0] == os.getpid():
            conn.close()
        else:
            _inherited.append(conn)
        self._local.conn = None

    def close(self) -> None:
        """Close this thread's connection (others close when their thread ends)."""
        self._drop()

    def _ensure_schema(self, conn: sqlite3.Connection) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            # Switching to WAL needs a moment of exclusive access, which the busy handler
            # does not always wait for while another process is creating the file.
            try:
                conn.execute("PRAGMA journal_mode = WAL").fetchone()
                break
            except sqlite3.OperationalError as err:
                if "locked" not in str(err) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        if not self._tables(conn):
            with _transaction(conn):
                if not self._tables(conn):
                    for statement in _SCHEMA:
                        conn.execute(statement)
                    conn.execute(
                        "INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                    )
        tables = self._tables(conn)
        if "meta" not in tables:
            raise self._wrong_schema(f"no meta table; it holds {', '.join(sorted(tables))}")
        row = conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
        if row is None or not str(row[0]).isdigit():
            raise self._wrong_schema("no schema version")
        version = int(row[0])
        if version > SCHEMA_VERSION:
            raise TuningDatabaseError(
                f"{self.path} was written by a newer minicomp (schema version {version}; this "
                f"one reads {SCHEMA_VERSION}); upgrade minicomp or {_CLEAR_HINT}",
                self.path,
            )
        if version < SCHEMA_VERSION:
            self._migrate(conn, version)
        columns = tuple(row[1] for row in conn.execute("PRAGMA table_info(records)"))
        if columns != _COLUMNS:
            raise self._wrong_schema(f"records has columns {', '.join(columns) or 'none'}")

    def _migrate(self, conn: sqlite3.Connection, version: int) -> None:
        with _transaction(conn):
            # Read again under the write lock: another process may have migrated meanwhile.
            row = conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
            for step in range(int(row[0]), SCHEMA_VERSION):
                if step not in _MIGRATIONS:
                    raise self._wrong_schema(f"schema version {version} cannot be migrated")
                for statement in _MIGRATIONS[step]:
                    conn.execute(statement)
            conn.execute(
                "UPDATE meta SET value = ? WHERE name = 'schema_version'", (str(SCHEMA_VERSION),)
            )

    @staticmethod
    def _tables(conn: sqlite3.Connection) -> set[str]:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        return {name for (name,) in rows}

    def _decode(self, row: tuple) -> Record | None:
        """The checked record of a row, or None (with a warning) when it is damaged."""
        try:
            return _record(row)
        except (ValueError, TypeError) as err:
            warnings.warn(
                f"minicomp: skipped the damaged tuning record {row[0]} of {self.path} ({err}); "
                "`minicomp cache prune` removes it",
                TuningRecordWarning,
                stacklevel=3,
            )
            return None

    @staticmethod
    def _compact(conn: sqlite3.Connection) -> None:
        # Give the freed pages back to the file system; skipped when others hold the file.
        with contextlib.suppress(sqlite3.OperationalError):
            conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    # -- the compiler's side ---------------------------------------------------------------

    def lookup(
        self,
        template: str,
        signature: str,
        fusion: str,
        arch: str,
        *,
        touch: bool = True,
        valid: Callable[[Record], bool] | None = None,
    ) -> Record | None:
        """The record of this minicomp version for these key fields, or None.

        A hit counts in the record's ``hits`` and sets its ``last_used`` (unless ``touch`` is
        false). A damaged record, or one that ``valid`` (the template's check of its config)
        refuses or raises TypeError or ValueError for, is skipped with a TuningRecordWarning.
        Raises TuningDatabaseError when the file cannot be read.
        """
        key = record_key(template, signature, fusion, arch, current_version())
        with self._connect(create=False) as conn:
            if conn is None:
                return None
            if touch:
                with _transaction(conn):
                    conn.execute(
                        "UPDATE records SET hits = hits + 1, last_used = ? WHERE key = ?",
                        (time.time(), key),
                    )
                    row = conn.execute(f"{_SELECT} WHERE key = ?", (key,)).fetchone()
            else:
                row = conn.execute(f"{_SELECT} WHERE key = ?", (key,)).fetchone()
        record = None if row is None else self._decode(row)
        # The key is a hash prefix: make sure it is this operator's record.
        if record is None or (record.template, record.signature, record.fusion, record.arch) != (
            template,
            signature,
            fusion,
            arch,
        ):
            return None
        if valid is not None and not _accepts(valid, record):
            warnings.warn(
                f"minicomp: skipped the tuning record {record.key} of {self.path}: "
                f"{template} cannot use its config {_short(record.config)}",
                TuningRecordWarning,
                stacklevel=2,
            )
            return None
        return record

    def store(self, record: Record) -> None:
        """Insert ``record``, replacing one with the same key, in one transaction."""
        with self._connect(create=True) as conn, _transaction(conn):
            placeholders = ", ".join("?" * len(_COLUMNS))
            conn.execute(f"INSERT OR REPLACE INTO records VALUES ({placeholders})", _row(record))

    def _warn_once(self, err: TuningDatabaseError) -> None:
        with _warned_lock:
            if self.path in _warned_paths:
                return
            _warned_paths.add(self.path)
        warnings.warn(
            f"{err} -- compiling without tuning records from it", RuntimeWarning, stacklevel=3
        )

    def safe_lookup(
        self,
        template: str,
        signature: str,
        fusion: str,
        arch: str,
        *,
        valid: Callable[[Record], bool] | None = None,
    ) -> Record | None:
        """:meth:`lookup` for the compiler: on a database error, warn once and return None."""
        try:
            return self.lookup(template, signature, fusion, arch, valid=valid)
        except TuningDatabaseError as err:
            self._warn_once(err)
            return None

    def safe_store(self, record: Record) -> bool:
        """:meth:`store` for the compiler: on a database error, warn once and return False."""
        try:
            self.store(record)
        except TuningDatabaseError as err:
            self._warn_once(err)
            return False
        return True

    # -- inspection and management ---------------------------------------------------------

    def records(self, template: str | None = None, arch: str | None = None) -> list[Record]:
        """Every record (of any version), optionally of one template and/or architecture."""
        where, params = [], []
        for column, value in (("template", template), ("arch", arch)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        query = _SELECT + (" WHERE " + " AND ".join(where) if where else "")
        query += " ORDER BY template, arch, signature, fusion, version"
        with self._connect(create=False) as conn:
            rows = [] if conn is None else conn.execute(query, params).fetchall()
        return [r for r in map(self._decode, rows) if r is not None]

    def get(self, key: str) -> Record | None:
        """The record with this exact key, or None."""
        with self._connect(create=False) as conn:
            if conn is None:
                return None
            row = conn.execute(f"{_SELECT} WHERE key = ?", (key,)).fetchone()
        return None if row is None else self._decode(row)

    def find(self, prefix: str) -> list[Record]:
        """The records whose key starts with ``prefix`` (keys are lowercase hex)."""
        prefix = prefix.lower()
        if not prefix or any(c not in "0123456789abcdef" for c in prefix):
            return []
        with self._connect(create=False) as conn:
            if conn is None:
                return []
            query = f"{_SELECT} WHERE substr(key, 1, ?) = ? ORDER BY key"
            rows = conn.execute(query, (len(prefix), prefix)).fetchall()
        return [r for r in map(self._decode, rows) if r is not None]

    def stats(self) -> dict[str, Any]:
        """Counts for `minicomp cache stats`: entries (all versions and this one), bytes on
        disk, record payload bytes, total hits, and entries per template and architecture."""
        result: dict[str, Any] = {
            "path": self.path,
            "exists": self.exists(),
            "version": current_version(),
            "entries": 0,
            "current_version_entries": 0,
            "bytes": self.file_bytes(),
            "payload_bytes": 0,
            "hits": 0,
            "templates": {},
            "archs": {},
        }
        with self._connect(create=False) as conn:
            if conn is None:
                return result
            entries, payload, hits = conn.execute(
                f"SELECT count(*), coalesce(sum({_ROW_BYTES_SQL}), 0), coalesce(sum(hits), 0) "
                "FROM records"
            ).fetchone()
            current = conn.execute(
                "SELECT count(*) FROM records WHERE version = ?", (current_version(),)
            ).fetchone()[0]
            for column in ("template", "arch"):
                rows = conn.execute(
                    f"SELECT {column}, count(*) FROM records GROUP BY {column} ORDER BY {column}"
                )
                result[column + "s"] = dict(rows.fetchall())
        result.update(
            entries=entries, current_version_entries=current, payload_bytes=payload, hits=hits
        )
        result["bytes"] = self.file_bytes()
        return result

    def delete(self, keys: Iterable[str]) -> int:
        """Delete the records with these keys; return how many there were."""
        keys = list(keys)
        with self._connect(create=False) as conn:
            if conn is None or not keys:
                return 0
            with _transaction(conn):
                before = conn.total_changes
                conn.executemany("DELETE FROM records WHERE key = ?", [(k,) for k in keys])
                removed = conn.total_changes - before
            if removed:
                self._compact(conn)
        return removed

    def clear(self) -> int:
        """Delete every record; return how many there were. Other processes may keep using
        the file meanwhile (unlike deleting it)."""
        with self._connect(create=False) as conn:
            if conn is None:
                return 0
            with _transaction(conn):
                removed = conn.execute("DELETE FROM records").rowcount
            self._compact(conn)
        return removed

    def remove_files(self) -> int:
        """Delete the database file and its companions, even a corrupt one; return the bytes
        freed. A process still using the file keeps its open copy until it closes it."""
        self._drop()
        freed = 0
        for name in self.files():
            with contextlib.suppress(OSError):
                size = os.path.getsize(name)
                os.unlink(name)
                freed += size
        return freed

    def prune(
        self,
        older_than_s: float | None = None,
        max_bytes: int | None = None,
        *,
        now: float | None = None,
    ) -> list[Record]:
        """Delete records unused for more than ``older_than_s`` seconds, then the least
        recently used ones until the records' payload fits in ``max_bytes``; return them.
        Damaged records go too (with a TuningRecordWarning): nothing can use them."""
        now = time.time() if now is None else now
        with self._connect(create=False) as conn:
            if conn is None:
                return []
            with _transaction(conn):
                # A timestamp in the future would keep its record forever.
                present = time.time()
                conn.execute(
                    "UPDATE records SET created = min(created, ?), last_used = min(last_used, ?)"
                    " WHERE created > ? OR last_used > ?",
                    (present,) * 4,
                )
                query = f"SELECT {', '.join(_COLUMNS)}, {_ROW_BYTES_SQL} FROM records"
                rows = conn.execute(query + " ORDER BY last_used DESC, key").fetchall()
                doomed, keys, damaged, kept, full = [], [], [], 0, False
                for *row, size in rows:
                    try:
                        record = _record(tuple(row))
                    except (ValueError, TypeError):
                        damaged.append(row[0])
                        continue
                    if older_than_s is not None and record.last_used < now - older_than_s:
                        doomed.append(record)
                    elif full or (max_bytes is not None and kept + size > max_bytes):
                        full = True  # everything older goes too: oldest first until it fits
                        doomed.append(record)
                    else:
                        kept += size
                        continue
                    keys.append(row[0])
                keys += damaged
                conn.executemany("DELETE FROM records WHERE key = ?", [(k,) for k in keys])
            if keys:
                self._compact(conn)
        if damaged:
            warnings.warn(
                f"minicomp: removed {len(damaged)} damaged tuning records from {self.path}: "
                + ", ".join(map(str, damaged[:5])),
                TuningRecordWarning,
                stacklevel=2,
            )
        return doomed

    def payload_bytes(self) -> int:
        """What the records weigh, as :meth:`prune` counts it for ``max_bytes``."""
        with self._connect(create=False) as conn:
            if conn is None:
                return 0
            return conn.execute(
                f"SELECT coalesce(sum({_ROW_BYTES_SQL}), 0) FROM records"
            ).fetchone()[0]

    # -- moving records between machines ---------------------------------------------------

    def export(
        self, path: str | os.PathLike, *, template: str | None = None, arch: str | None = None
    ) -> int:
        """Write the records (optionally one template's and/or architecture's) to a JSON
        file, atomically; return how many."""
        records = self.records(template=template, arch=arch)
        data = {
            "format": EXPORT_FORMAT,
            "format_version": EXPORT_FORMAT_VERSION,
            "minicomp_version": current_version(),
            "exported": time.time(),
            "records": [record.to_json() for record in records],
        }
        path = os.path.abspath(os.fspath(path))
        fd, tmp = tempfile.mkstemp(prefix=".tmp-export-", dir=os.path.dirname(path))
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1, sort_keys=True)
                f.write("\n")
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return len(records)

    def import_(self, path: str | os.PathLike) -> tuple[int, int, int]:
        """Merge an export file in one transaction; return (added, replaced, skipped).

        Of two records with the same key the one created later wins, so importing the same
        file twice changes nothing. Raises ExportFileError, importing nothing, when the file
        is not a valid export of this format version.
        """
        records = read_export(path)
        added = replaced = skipped = 0
        placeholders = ", ".join("?" * len(_COLUMNS))
        with self._connect(create=True) as conn, _transaction(conn):
            for record in records:
                row = conn.execute(
                    "SELECT created FROM records WHERE key = ?", (record.key,)
                ).fetchone()
                if row is not None and record.created <= row[0]:
                    skipped += 1
                    continue
                conn.execute(
                    f"INSERT OR REPLACE INTO records VALUES ({placeholders})", _row(record)
                )
                if row is None:
                    added += 1
                else:
                    replaced += 1
        return added, replaced, skipped
