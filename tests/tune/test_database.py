"""Tests of the tuning database: records, versions, concurrency, damage, pruning, export."""

import dataclasses
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
import warnings

import pytest

from minicomp import config
from minicomp.tune import database
from minicomp.tune.database import Record, TuningDatabase, TuningDatabaseError

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _record(signature="f16[128,64]x[64,32]", template="matmul", arch="sm_90", **kw) -> Record:
    kw.setdefault("config", {"block_m": 64, "block_n": 32, "stages": 3})
    return Record(template, signature, kw.pop("fusion", "relu(out)"), arch, **kw)


@pytest.fixture
def db(tmp_path) -> TuningDatabase:
    return TuningDatabase(tmp_path / "tuning.sqlite")


def test_store_and_lookup_round_trip(db):
    record = _record(config={"tile": (64, 32), "warps": 4}, time_us=12.5, candidates=24)
    assert db.lookup(record.template, record.signature, record.fusion, record.arch) is None
    db.store(record)
    # A second handle on the same file, as another process would open it.
    found = TuningDatabase(db.path).lookup("matmul", record.signature, "relu(out)", "sm_90")
    assert found is not None and found.key == record.key
    assert found.config == {"tile": [64, 32], "warps": 4}  # JSON-normalized, as stored
    assert (found.time_us, found.candidates, found.created) == (12.5, 24, record.created)
    assert found.hits == 1
    # Each key field matters.
    assert db.lookup("matmul", record.signature, "", "sm_90") is None
    assert db.lookup("matmul", record.signature, "relu(out)", "sm_80") is None
    assert db.lookup("conv", record.signature, "relu(out)", "sm_90") is None
    assert db.lookup("matmul", "f16[128,64]x[64,33]", "relu(out)", "sm_90") is None


def test_store_replaces_a_record_with_the_same_key(db):
    db.store(_record(config={"block_m": 64}, time_us=9.0))
    db.store(_record(config={"block_m": 128}, time_us=7.0))
    (record,) = db.records()
    assert record.config == {"block_m": 128} and record.time_us == 7.0


def test_keys_are_stable_short_and_distinct():
    key = database.record_key("matmul", "f32[4,4]", "", "sm_90", "0.1.0+tuning1")
    assert key == database.record_key("matmul", "f32[4,4]", "", "sm_90", "0.1.0+tuning1")
    assert len(key) == database.KEY_LENGTH and set(key) <= set("0123456789abcdef")
    # Fixed across runs and machines: exported files and `minicomp cache show` rely on it.
    assert key == "eb92513d416f92ee"
    fields = ["matmul", "f32[4,4]", "", "sm_90", "0.1.0+tuning1"]
    keys = {key}
    for i in range(len(fields)):
        changed = list(fields)
        changed[i] += "x"
        keys.add(database.record_key(*changed))
    assert len(keys) == len(fields) + 1
    # Length prefixes keep field boundaries: ("ab", "c") is not ("a", "bc").
    assert database.record_key("ab", "c", "", "", "") != database.record_key("a", "bc", "", "", "")
    assert _record().key == database.record_key(
        "matmul", _record().signature, "relu(out)", "sm_90", database.current_version()
    )


def test_records_of_another_version_are_kept_but_never_returned(db):
    old = _record(version="0.0.1+tuning0", config={"block_m": 16})
    db.store(old)
    assert db.lookup(old.template, old.signature, old.fusion, old.arch) is None
    assert db.records() == [old]
    stats = db.stats()
    assert (stats["entries"], stats["current_version_entries"]) == (1, 0)
    current = _record(config={"block_m": 64})
    db.store(current)
    assert db.lookup(old.template, old.signature, old.fusion, old.arch).config == current.config
    assert len(db.records()) == 2


def test_lookup_counts_hits_and_sets_last_used(db):
    record = _record(created=1000.0)
    db.store(record)
    before = time.time()
    for _ in range(3):
        db.lookup(record.template, record.signature, record.fusion, record.arch)
    stored = db.get(record.key)
    assert stored.hits == 3 and stored.last_used >= before and stored.created == 1000.0
    db.lookup(record.template, record.signature, record.fusion, record.arch, touch=False)
    assert db.get(record.key).hits == 3
    assert db.stats()["hits"] == 3


def test_filters_find_and_stats(db):
    db.store(_record("a", template="matmul", arch="sm_90"))
    db.store(_record("b", template="matmul", arch="sm_80"))
    db.store(_record("c", template="conv", arch="sm_90"))
    assert [r.signature for r in db.records(template="matmul")] == ["b", "a"]
    assert [r.signature for r in db.records(arch="sm_90")] == ["c", "a"]
    assert [r.signature for r in db.records(template="conv", arch="sm_80")] == []
    key = db.records(template="conv")[0].key
    assert [r.signature for r in db.find(key[:5])] == ["c"]
    assert db.find("not-hex") == [] and db.get("0" * 16) is None
    stats = db.stats()
    assert stats["entries"] == 3 and stats["templates"] == {"conv": 1, "matmul": 2}
    assert stats["archs"] == {"sm_80": 1, "sm_90": 2}
    assert stats["bytes"] >= os.path.getsize(db.path) > 0
    assert db.delete([key, "0" * 16]) == 1 and len(db.records()) == 2
    assert db.clear() == 2 and db.records() == []


def test_a_missing_file_reads_as_empty_and_is_only_created_by_a_write(tmp_path):
    db = TuningDatabase(tmp_path / "sub" / "tuning.sqlite")
    assert db.records() == [] and db.lookup("t", "s", "", "cpu") is None
    assert db.stats()["entries"] == 0 and db.prune(older_than_s=0) == []
    assert not os.path.exists(db.path)
    db.store(_record(arch="cpu"))
    assert db.exists() and len(db.records()) == 1


def test_default_path_follows_the_cache_dir_option(tmp_path):
    with config.patch(cache_dir="~/some-minicomp-cache"):
        expected = os.path.join(os.path.expanduser("~/some-minicomp-cache"), "tuning.sqlite")
        assert database.default_path() == expected
        assert TuningDatabase().path == expected
    assert database.default_path(tmp_path) == str(tmp_path / "tuning.sqlite")


def test_record_checks_its_fields():
    with pytest.raises(TypeError, match="JSON"):
        Record("matmul", "s", "", "sm_90", {"bad": object()})
    with pytest.raises(TypeError, match="arch"):
        Record("matmul", "s", "", 90, {})
    assert Record("t", "s", "", "cpu", {}, created=5.0).last_used == 5.0


_WRITER = """
import os, sys, time
from minicomp.tune.database import Record, TuningDatabase
path, worker, count, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.002)
db = TuningDatabase(path)
for i in range(count):
    config = {"worker": worker, "i": i}
    db.store(Record("matmul", f"w{worker}-i{i}", "", "sm_90", config, time_us=float(i)))
    found = db.lookup("matmul", f"w{worker}-i{i}", "", "sm_90")
    assert found is not None, (worker, i)
"""


def test_concurrent_writers_in_several_processes_all_land(tmp_path):
    path, go = str(tmp_path / "tuning.sqlite"), str(tmp_path / "go")
    workers, count = 4, 50
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([REPO_ROOT, os.environ.get("PYTHONPATH", "")])
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, path, str(w), str(count), go],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(workers)
    ]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready"
        # All start at once on a file none of them has created yet.
        open(go, "w").close()
        for proc in procs:
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    records = TuningDatabase(path).records()
    assert len(records) == workers * count
    got = {(r.config["worker"], r.config["i"]) for r in records}
    assert got == {(w, i) for w in range(workers) for i in range(count)}
    assert all(r.signature == f"w{r.config['worker']}-i{r.config['i']}" for r in records)


def test_threads_sharing_one_handle(db):
    errors = []

    def work(t):
        try:
            for i in range(20):
                db.store(_record(f"t{t}-{i}", config={"t": t, "i": i}))
                assert db.lookup("matmul", f"t{t}-{i}", "relu(out)", "sm_90") is not None
        except Exception as err:  # reported below, on the test's thread
            errors.append(err)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(db.records()) == 120 and db.stats()["hits"] == 120


def _assert_clear_error(err: TuningDatabaseError, path: str) -> None:
    assert path in str(err) and "minicomp cache clear --tuning" in str(err)


def test_a_file_that_is_not_a_database_raises_a_clear_error(db):
    with open(db.path, "wb") as f:
        f.write(os.urandom(4096))
    for call in (
        db.records,
        db.stats,
        lambda: db.lookup("matmul", "s", "", "sm_90"),
        lambda: db.store(_record()),
    ):
        with pytest.raises(TuningDatabaseError) as info:
            call()
        _assert_clear_error(info.value, db.path)


def test_safe_calls_warn_once_and_carry_on(db):
    with open(db.path, "w") as f:
        f.write("not a database, just text " * 100)
    with pytest.warns(RuntimeWarning, match="compiling without tuning records"):
        assert db.safe_lookup("matmul", "s", "", "sm_90") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning for the same file would raise
        assert db.safe_lookup("matmul", "s", "", "sm_90") is None
        assert db.safe_store(_record()) is False
    assert db.remove_files() > 0 and not db.exists()
    assert db.safe_store(_record()) is True
    assert db.safe_lookup("matmul", _record().signature, "relu(out)", "sm_90") is not None


def test_a_truncated_database_raises_a_clear_error(db):
    for i in range(300):
        db.store(_record(f"sig-{i}", config={"pad": "x" * 200}))
    db.close()
    # Move everything from the WAL into the main file, then cut that in half.
    with sqlite3.connect(db.path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = os.path.getsize(db.path)
    with open(db.path, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(TuningDatabaseError) as info:
        TuningDatabase(db.path).records()
    _assert_clear_error(info.value, db.path)


def _raw(path, *statements):
    conn = sqlite3.connect(path)
    try:
        for statement in statements:
            conn.execute(statement)
        conn.commit()
    finally:
        conn.close()


def test_a_database_of_another_schema_is_refused(tmp_path):
    other = str(tmp_path / "other.sqlite")
    _raw(other, "CREATE TABLE results (name TEXT)")
    with pytest.raises(TuningDatabaseError, match="schema version") as info:
        TuningDatabase(other).records()
    _assert_clear_error(info.value, other)

    columns = str(tmp_path / "columns.sqlite")
    _raw(
        columns,
        "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
        "INSERT INTO meta VALUES ('schema_version', '1')",
        "CREATE TABLE records (key TEXT PRIMARY KEY, config TEXT)",
    )
    with pytest.raises(TuningDatabaseError, match="columns key, config"):
        TuningDatabase(columns).lookup("t", "s", "", "cpu")


def test_a_newer_schema_is_refused_and_an_older_one_migrated(tmp_path, monkeypatch):
    db = TuningDatabase(tmp_path / "tuning.sqlite")
    db.store(_record())
    _raw(db.path, "UPDATE meta SET value = '99' WHERE name = 'schema_version'")
    with pytest.raises(TuningDatabaseError, match="newer minicomp"):
        TuningDatabase(db.path).records()

    _raw(db.path, "UPDATE meta SET value = '0' WHERE name = 'schema_version'")
    with pytest.raises(TuningDatabaseError, match="cannot be migrated"):
        TuningDatabase(db.path).records()
    # With a migration step from 0 the file is brought up to date and stays usable.
    monkeypatch.setitem(database._MIGRATIONS, 0, ("UPDATE records SET hits = hits + 7",))
    assert [r.hits for r in TuningDatabase(db.path).records()] == [7]
    with sqlite3.connect(db.path) as conn:
        (version,) = conn.execute("SELECT value FROM meta").fetchone()
    assert int(version) == database.SCHEMA_VERSION


def test_prune_by_age_uses_last_used(db):
    now = 1_000_000.0
    day = 86400.0
    for name, last_used in (("old", now - 10 * day), ("recent", now - day), ("new", now)):
        db.store(_record(name, created=now - 20 * day, last_used=last_used))
    removed = db.prune(older_than_s=2 * day, now=now)
    assert [r.signature for r in removed] == ["old"]
    assert sorted(r.signature for r in db.records()) == ["new", "recent"]
    assert db.prune(older_than_s=2 * day, now=now) == []


def test_prune_by_size_removes_the_least_recently_used_first(db):
    for i in range(10):
        db.store(_record(f"sig-{i:02d}", config={"pad": "x" * 500}, last_used=1000.0 + i))
    total = db.payload_bytes()
    each = total // 10
    assert db.prune(max_bytes=total) == []
    removed = db.prune(max_bytes=4 * each + each // 2)
    assert sorted(r.signature for r in removed) == [f"sig-{i:02d}" for i in range(6)]
    assert sorted(r.signature for r in db.records()) == [f"sig-{i:02d}" for i in range(6, 10)]
    assert db.payload_bytes() <= 4 * each + each // 2
    before = os.path.getsize(db.path)
    assert len(db.prune(max_bytes=0)) == 4 and db.records() == []
    assert os.path.getsize(db.path) <= before  # the freed pages went back


def test_export_import_round_trip_into_a_fresh_database(tmp_path, db):
    for i in range(5):
        db.store(_record(f"sig-{i}", arch="sm_90" if i < 4 else "sm_80", time_us=i or None))
    db.lookup("matmul", "sig-1", "relu(out)", "sm_90")
    exported = tmp_path / "export.json"
    assert db.export(exported, arch="sm_90") == 4
    data = json.loads(exported.read_text())
    assert data["format"] == database.EXPORT_FORMAT
    assert data["format_version"] == database.EXPORT_FORMAT_VERSION

    fresh = TuningDatabase(tmp_path / "other" / "tuning.sqlite")
    assert fresh.import_(exported) == (4, 0, 0)
    assert fresh.records() == db.records(arch="sm_90")
    assert fresh.import_(exported) == (0, 0, 4)  # importing twice changes nothing


def test_import_keeps_the_newer_of_two_records(tmp_path, db):
    newer_there = _record("a", config={"side": "file"}, created=2000.0)
    older_there = _record("b", config={"side": "file"}, created=1000.0)
    db.store(newer_there)
    db.store(older_there)
    exported = tmp_path / "export.json"
    db.export(exported)
    local = TuningDatabase(tmp_path / "local.sqlite")
    local.store(_record("a", config={"side": "local"}, created=1500.0))
    local.store(_record("b", config={"side": "local"}, created=1500.0))
    local.store(_record("c", config={"side": "local"}, created=1500.0))
    assert local.import_(exported) == (0, 1, 1)
    sides = {r.signature: r.config["side"] for r in local.records()}
    assert sides == {"a": "file", "b": "local", "c": "local"}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "invalid JSON"),
        ('["a list"]', "not a tuning export"),
        ('{"format": "something-else", "format_version": 1, "records": []}', "not a tuning"),
        ('{"format": "minicomp-tuning", "format_version": 2, "records": []}', "version 2"),
        ('{"format": "minicomp-tuning", "format_version": 1, "records": {}}', "must be a list"),
    ],
)
def test_import_refuses_a_bad_file(tmp_path, db, content, message):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with pytest.raises(database.ExportFileError, match=message) as info:
        db.import_(bad)
    assert str(bad) in str(info.value)
    assert not db.exists()


def test_import_refuses_a_bad_record_and_imports_nothing(tmp_path, db):
    db.store(_record("good"))
    db.store(_record("bad"))
    exported = tmp_path / "export.json"
    db.export(exported)
    data = json.loads(exported.read_text())
    data["records"][1]["hits"] = "many"
    exported.write_text(json.dumps(data))
    fresh = TuningDatabase(tmp_path / "fresh.sqlite")
    with pytest.raises(database.ExportFileError, match="record 1: bad value for 'hits'"):
        fresh.import_(exported)
    assert fresh.records() == []
    with pytest.raises(database.ExportFileError, match="cannot read"):
        fresh.import_(tmp_path / "missing.json")


# -- records are data, not trust -----------------------------------------------------------


def _plant(path, record: Record, **raw) -> None:
    """Write a row the way a crafted or damaged file would hold it, past every check."""
    values = dict(zip(database._COLUMNS, database._row(record)), **raw)
    TuningDatabase(path).store(_record("seed"))  # the file and its schema
    columns = ", ".join(values)
    conn = sqlite3.connect(path)
    conn.execute(
        f"INSERT OR REPLACE INTO records ({columns}) VALUES ({', '.join('?' * len(values))})",
        list(values.values()),
    )
    conn.commit()
    conn.close()


def test_the_largest_search_space_is_the_options_largest():
    (field,) = [f for f in dataclasses.fields(config.Options) if f.name == "search_space"]
    assert database.MAX_LEVEL == max(field.metadata["choices"])


def test_a_crafted_record_is_capped_and_clamped(db):
    crafted = _record(config={"tile": 64, "_search_space": 99}, created=1e12, last_used=1e12)
    _plant(db.path, crafted)
    found = db.lookup(crafted.template, crafted.signature, crafted.fusion, crafted.arch)
    assert found.config["_search_space"] == database.MAX_LEVEL
    assert found.created <= time.time() and found.last_used <= time.time()
    # No longer forever the newest: an age-based prune can remove it.
    assert [r.key for r in db.prune(older_than_s=0, now=time.time() + 1)] == [
        crafted.key,
        _record("seed").key,
    ]


def test_a_record_its_template_cannot_use_is_skipped_with_a_warning(db):
    record = _record(config={"tile": 7, "_search_space": 2})
    db.store(record)
    fields = (record.template, record.signature, record.fusion, record.arch)

    def valid(found):
        return found.config["tile"] % 16 == 0

    with pytest.warns(database.TuningRecordWarning, match="cannot use its config"):
        assert db.safe_lookup(*fields, valid=valid) is None

    def unknown_field(found):
        raise TypeError("__init__() got an unexpected keyword argument 'tile'")

    with pytest.warns(database.TuningRecordWarning):
        assert db.lookup(*fields, valid=unknown_field) is None
    assert db.lookup(*fields, valid=lambda found: True) == db.get(record.key)


@pytest.mark.parametrize(
    "raw",
    [
        {"config": "{not json"},
        {"config": json.dumps({"tile": 10**30})},
        {"config": "[" * 50_000 + "]" * 50_000},
        {"hits": "many"},
    ],
    ids=["bad-json", "huge-int", "deep", "text-hits"],
)
def test_one_damaged_row_is_skipped_and_pruned_not_fatal(db, raw):
    damaged = _record("damaged")
    _plant(db.path, damaged, **raw)
    with pytest.warns(database.TuningRecordWarning, match=damaged.key):
        assert [r.signature for r in db.records()] == ["seed"]
    with pytest.warns(database.TuningRecordWarning):
        assert db.lookup("matmul", "damaged", "relu(out)", "sm_90", touch=False) is None
    with pytest.warns(database.TuningRecordWarning, match="removed 1 damaged"):
        assert db.prune(older_than_s=1e9) == []
    assert db.stats()["entries"] == 1


def _export(path, *records: dict) -> str:
    data = {"format": "minicomp-tuning", "format_version": 1, "records": list(records)}
    path.write_text(json.dumps(data))
    return str(path)


def test_import_clamps_the_future_and_caps_the_level(tmp_path, db):
    item = _record(config={"_search_space": 7}, created=4e12, last_used=4e12).to_json()
    assert db.import_(_export(tmp_path / "future.json", item)) == (1, 0, 0)
    (record,) = db.records()
    assert record.created <= time.time() and record.last_used <= time.time()
    assert record.config["_search_space"] == database.MAX_LEVEL


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hits": 2**64}, "bad value for 'hits'"),
        ({"candidates": 2**70}, "bad value for 'candidates'"),
        ({"config": {"tile": 2**80}}, "bad value for 'config'"),
        ({"config": {"_search_space": "max"}}, "bad value for 'config'"),
        ({"config": {"a": [[[[[[1]]]]]]}}, "bad value for 'config'"),
    ],
)
def test_import_refuses_out_of_range_numbers_with_one_error(tmp_path, db, change, message):
    item = {**_record().to_json(), **change}
    with pytest.raises(database.ExportFileError, match=message):
        db.import_(_export(tmp_path / "bad.json", item))
    assert not db.exists()


def test_import_refuses_deeply_nested_json_with_one_error(tmp_path, db):
    deep = tmp_path / "deep.json"
    deep.write_text('{"records": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(database.ExportFileError, match="nested too deeply"):
        db.import_(deep)
