"""The build lock (backends/cache.py): one holder per entry at a time, across threads and
processes alike, a waiter that gives up after its timeout, no lock file left behind; and who
built an entry, as its meta.json records it."""

import os
import threading
import time

from minicomp.backends import cache


def _entry(tmp_path, key="ab" * 32):
    return str(tmp_path), cache.entry_dir(str(tmp_path), "kernels", key)


def test_a_second_taker_waits_for_the_holder(tmp_path):
    root, entry = _entry(tmp_path)
    order = []
    holding = threading.Event()

    def hold():
        with cache.build_lock(root, entry) as held:
            assert held
            holding.set()
            time.sleep(0.3)
            order.append("first done")

    thread = threading.Thread(target=hold)
    thread.start()
    holding.wait(10)
    with cache.build_lock(root, entry) as held:
        assert held
        order.append("second in")
    thread.join()
    assert order == ["first done", "second in"]
    assert os.listdir(os.path.join(root, cache.LOCKS)) == []


def test_entries_lock_independently(tmp_path):
    root, first = _entry(tmp_path, "ab" * 32)
    _, second = _entry(tmp_path, "cd" * 32)
    with cache.build_lock(root, first), cache.build_lock(root, second, timeout=0.5) as held:
        assert held


def test_a_waiter_builds_anyway_after_its_timeout(tmp_path):
    root, entry = _entry(tmp_path)
    with cache.build_lock(root, entry):
        start = time.monotonic()
        with cache.build_lock(root, entry, timeout=0.2) as held:
            assert not held
        assert time.monotonic() - start < 5


def test_meta_records_who_built_an_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    root, entry = _entry(tmp_path)
    with cache.build_dir(root, "test") as tmp:
        with open(os.path.join(tmp, "lib.so"), "wb") as f:
            f.write(b"\0")
        with cache.observing() as events:
            cache.publish(tmp, entry)
    who = cache.builder()
    assert who["rank"] == 3 and who["pid"] == os.getpid()
    assert cache.lookup(root, entry, "lib.so")["built_by"] == who
    assert [(e.kind, e.built, e.builder) for e in events] == [("kernels", True, who)]
    assert cache.describe_builder(who) == "this process (rank 3)"
    other = {**who, "pid": who["pid"] + 1}
    assert cache.describe_builder(other) == f"rank 3 (pid {who['pid'] + 1})"
    assert cache.describe_builder({**other, "host": "elsewhere"}).endswith(" on elsewhere")
    assert cache.describe_builder(None) == "an unknown process"


def test_a_cache_where_no_lock_can_be_made_builds_without_one(tmp_path):
    root, entry = _entry(tmp_path)
    (tmp_path / cache.BUILDING).write_text("not a folder")  # as a read-only cache would fail
    with cache.build_lock(root, entry) as held:
        assert not held
