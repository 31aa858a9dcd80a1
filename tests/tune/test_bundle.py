"""Cache bundles: a warm cache (tuning records and cubins) carried to another cache."""

import hashlib
import io
import json
import os
import tarfile

import pytest

from minicomp.backends import cache
from minicomp.backends.cuda import nvrtc
from minicomp.tune import bundle
from minicomp.tune.database import Record, TuningDatabase, default_path

SOURCE = 'extern "C" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }\n'


def _nvrtc_or_skip():
    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(str(err))


def test_a_bundled_cubin_is_a_disk_hit_in_the_other_cache(tmp_path):
    _nvrtc_or_skip()
    here, there = str(tmp_path / "here"), str(tmp_path / "there")
    built = nvrtc.compile_cuda(SOURCE, arch="sm_90", cache_dir=here)
    TuningDatabase(default_path(here)).store(
        Record("matmul_tc", "f16[64,64]x[64,64]", "", "sm_90", {"bm": 64}, time_us=3.0)
    )
    manifest = bundle.write_bundle(here, str(tmp_path / "b.tar.gz"))
    assert (manifest["records"], manifest["cubins"]) == (1, 1)
    counts = bundle.read_bundle(str(tmp_path / "b.tar.gz"), there)
    assert (counts["added"], counts["cubins"]) == (1, 1)
    nvrtc.clear_memory_cache()
    nvrtc.reset_compile_stats()
    again = nvrtc.compile_cuda(SOURCE, arch="sm_90", cache_dir=there)
    assert again.cubin == built.cubin
    assert nvrtc.compile_stats()["compiles"] == 0 and nvrtc.compile_stats()["disk_hits"] == 1
    assert [r.template for r in TuningDatabase(default_path(there)).records()] == ["matmul_tc"]


def test_the_size_limit_keeps_records_and_drops_cubins(tmp_path):
    _nvrtc_or_skip()
    here = str(tmp_path / "here")
    nvrtc.compile_cuda(SOURCE, arch="sm_90", cache_dir=here)
    manifest = bundle.write_bundle(here, str(tmp_path / "b.tar.gz"), max_bytes=10)
    assert manifest["cubins"] == 0


def _tar(path, members: dict) -> str:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


MANIFEST = b'{"format": "minicomp-cache-bundle", "format_version": 1}'


@pytest.mark.parametrize(
    "members, message",
    [
        ({"minicomp-bundle.json": MANIFEST, "../../evil.so": b"x"}, "unexpected member"),
        ({"minicomp-bundle.json": MANIFEST, "cubins/ab/../../x": b"x"}, "unexpected member"),
        ({"cubins/ab/" + "ab" + "0" * 62 + "/kernel.cubin": b"x"}, "no minicomp-bundle.json"),
        ({"minicomp-bundle.json": b"[1, 2"}, "damaged"),
    ],
)
def test_a_foreign_or_damaged_bundle_imports_nothing(tmp_path, members, message):
    path = _tar(tmp_path / "bad.tar.gz", members)
    with pytest.raises(bundle.BundleError, match=message):
        bundle.read_bundle(path, str(tmp_path / "cache"))
    assert not os.path.exists(tmp_path / "cache" / "cubins")
    assert not os.path.exists(tmp_path / "evil.so")


def _cubin_entry(key: str, cubin: bytes, recorded: bytes) -> dict:
    """A bundle's cubin entry whose meta.json records the hash of `recorded`."""
    files = {"kernel.cubin": hashlib.sha256(recorded).hexdigest()}
    meta = {"arch": "sm_90", "log": "", "resources": {}, "files": files}
    folder = f"cubins/{key[:2]}/{key}"
    return {f"{folder}/kernel.cubin": cubin, f"{folder}/meta.json": json.dumps(meta).encode()}


def test_a_cubin_not_matching_its_recorded_hash_is_not_imported(tmp_path):
    good, bad = "ab" + "1" * 62, "cd" + "2" * 62
    members = {
        "minicomp-bundle.json": MANIFEST,
        **_cubin_entry(good, b"\x7fELF good", b"\x7fELF good"),
        **_cubin_entry(bad, b"\x7fELF planted", b"\x7fELF what was built"),
    }
    path = _tar(tmp_path / "mixed.tar.gz", members)
    cache_dir = str(tmp_path / "cache")
    with pytest.warns(cache.CacheIntegrityWarning, match=f"{bad}.*differs"):
        counts = bundle.read_bundle(path, cache_dir)
    assert (counts["cubins"], counts["cubins_refused"]) == (1, 1)
    assert not os.path.exists(cache.entry_dir(cache_dir, "cubins", bad))
    meta = cache.lookup(cache_dir, cache.entry_dir(cache_dir, "cubins", good), "kernel.cubin")
    assert meta is not None and meta["arch"] == "sm_90"
