"""Tests of the config module: precedence, validation, patching and torch.compile modes."""

import os

import pytest

from minicomp import config


@pytest.fixture(autouse=True)
def _clean_config(monkeypatch):
    for name in config.names():
        monkeypatch.delenv("MINICOMP_" + name.upper(), raising=False)
    config.reset()
    yield
    config.reset()


def test_defaults():
    options = config.resolve()
    assert options == config.resolve(None) == config.resolve({})
    assert options.target == "auto"
    assert options.search_space == 0
    assert options.tensor_cores is True and options.cuda_graphs is True
    assert options.fallback == "eager"
    assert options.cache_dir == os.path.expanduser("~/.cache/minicomp")
    assert options.arch is None
    assert options.cflags == "-O3 -march=native -fopenmp -fno-math-errno -fPIC -shared"
    assert config.get("verbose") == 0


def test_precedence_options_over_set_over_env_over_default(monkeypatch):
    assert config.resolve().search_space == 0
    monkeypatch.setenv("MINICOMP_SEARCH_SPACE", "1")
    assert config.resolve().search_space == 1
    assert config.get("search_space") == 1
    config.set(search_space=2)
    assert config.resolve().search_space == 2
    assert config.get("search_space") == 2
    assert config.resolve({"search_space": 0}).search_space == 0
    # Options untouched by a layer fall through to the next one.
    assert config.resolve({"search_space": 0}).verbose == 0


def test_env_values_are_parsed_by_type(monkeypatch, tmp_path):
    monkeypatch.setenv("MINICOMP_CUDA_GRAPHS", "no")
    monkeypatch.setenv("MINICOMP_FREEZE", "TRUE")
    monkeypatch.setenv("MINICOMP_DEBUG", "1")
    monkeypatch.setenv("MINICOMP_TENSOR_CORES", "0")
    monkeypatch.setenv("MINICOMP_PARALLEL_COMPILE", "4")
    monkeypatch.setenv("MINICOMP_ARCH", "sm_90")
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path))
    options = config.resolve()
    assert options.cuda_graphs is False and options.tensor_cores is False
    assert options.freeze is True and options.debug is True
    assert options.parallel_compile == 4
    assert options.arch == "sm_90"
    assert options.cache_dir == str(tmp_path)
    monkeypatch.setenv("MINICOMP_ARCH", "")
    assert config.resolve().arch is None


@pytest.mark.parametrize(
    ("env", "text"),
    [
        ("MINICOMP_TENSOR_CORES", "maybe"),
        ("MINICOMP_SEARCH_SPACE", "3"),
        ("MINICOMP_VERBOSE", "loud"),
        ("MINICOMP_TARGET", "tpu"),
    ],
)
def test_bad_env_value_names_the_variable(monkeypatch, env, text):
    monkeypatch.setenv(env, text)
    with pytest.raises(ValueError, match=env):
        config.resolve()


def test_bad_values_are_rejected_with_the_allowed_ones():
    with pytest.raises(ValueError, match=r"'target'.*'auto', 'cpu', 'cuda', 'cuda-emu'"):
        config.set(target="tpu")
    with pytest.raises(ValueError, match=r"'search_space'.*one of 0, 1, 2"):
        config.resolve({"search_space": 5})
    with pytest.raises(ValueError, match="'tensor_cores'"):
        config.set(tensor_cores="yes")
    with pytest.raises(ValueError, match="'verbose'"):
        config.set(verbose=True)
    with pytest.raises(ValueError, match="'parallel_compile'.*>= 0"):
        config.set(parallel_compile=-1)
    with pytest.raises(ValueError, match="'fallback'"):
        config.set(fallback=None)
    # A failed set changes nothing, not even its valid part.
    with pytest.raises(ValueError):
        config.set(verbose=1, target="tpu")
    assert config.get("verbose") == 0


def test_unknown_names_are_rejected_listing_valid_ones():
    for call in (
        lambda: config.set(search_spce=1),
        lambda: config.get("search_spce"),
        lambda: config.resolve({"search_spce": 1}),
        lambda: config.patch(search_spce=1).__enter__(),
    ):
        with pytest.raises(ValueError, match="search_spce") as info:
            call()
        assert "did you mean 'search_space'" in str(info.value)
        assert all(name in str(info.value) for name in config.names())


def test_patch_restores_previous_values():
    config.set(verbose=1)
    with config.patch(verbose=2, target="cpu"):
        assert config.get("verbose") == 2
        assert config.resolve().target == "cpu"
        with config.patch(verbose=0):
            assert config.get("verbose") == 0
        assert config.get("verbose") == 2
    assert config.get("verbose") == 1
    assert config.get("target") == "auto"
    with pytest.raises(RuntimeError), config.patch(freeze=True):
        raise RuntimeError("boom")
    assert config.get("freeze") is False


def test_reset():
    config.set(verbose=2, freeze=True)
    config.reset("verbose")
    assert config.get("verbose") == 0 and config.get("freeze") is True
    config.reset()
    assert config.get("freeze") is False


def test_options_are_frozen():
    options = config.resolve()
    with pytest.raises(AttributeError):
        options.target = "cpu"


def test_from_torch_mode():
    assert config.from_torch_mode(None) == {}
    assert config.from_torch_mode("default") == {}
    assert config.from_torch_mode("reduce-overhead") == {"cuda_graphs": True}
    assert config.from_torch_mode("max-autotune") == {"search_space": 2}
    assert config.from_torch_mode("max-autotune-no-cudagraphs") == {
        "search_space": 2,
        "cuda_graphs": False,
    }
    with pytest.raises(ValueError, match="max-autotune"):
        config.from_torch_mode("fastest")
    # The mapping is a fresh dict each time, and valid input for resolve().
    config.from_torch_mode("max-autotune")["search_space"] = 0
    assert config.resolve(config.from_torch_mode("max-autotune")).search_space == 2


def test_describe_lists_every_option():
    text = config.describe()
    markdown = config.describe(markdown=True)
    for name in config.names():
        assert name in text and "MINICOMP_" + name.upper() in text
        assert f"`{name}`" in markdown
    assert "-O3 -march=native" in text
    assert markdown.count("\n") == len(config.names()) + 2


def test_mode_is_a_preset_under_every_explicit_option(monkeypatch):
    assert config.resolve(mode="max-autotune").search_space == 2
    options = config.resolve(mode="max-autotune-no-cudagraphs")
    assert options.search_space == 2 and options.cuda_graphs is False
    assert config.resolve(mode="reduce-overhead").cuda_graphs is True
    assert config.resolve(mode="default") == config.resolve()
    # Explicit options, set/patch and the environment each win over the mode.
    assert config.resolve({"search_space": 1}, mode="max-autotune").search_space == 1
    with config.patch(cuda_graphs=True):
        assert config.resolve(mode="max-autotune-no-cudagraphs").cuda_graphs is True
    monkeypatch.setenv("MINICOMP_SEARCH_SPACE", "0")
    assert config.resolve(mode="max-autotune").search_space == 0
    with pytest.raises(ValueError, match="unknown torch.compile mode 'fastest'"):
        config.resolve(mode="fastest")


def test_nvrtc_library(monkeypatch):
    assert config.resolve().nvrtc_library is None
    monkeypatch.setenv("MINICOMP_NVRTC_LIBRARY", "/opt/cuda/lib64/libnvrtc.so.12")
    assert config.resolve().nvrtc_library == "/opt/cuda/lib64/libnvrtc.so.12"
    monkeypatch.setenv("MINICOMP_NVRTC_LIBRARY", "")
    assert config.get("nvrtc_library") is None


def test_tune_budget(monkeypatch):
    assert config.resolve().tune_budget is None
    assert config.resolve({"tune_budget": 5}).tune_budget == 5
    monkeypatch.setenv("MINICOMP_TUNE_BUDGET", "120")
    assert config.resolve().tune_budget == 120
    monkeypatch.setenv("MINICOMP_TUNE_BUDGET", "none")
    assert config.resolve().tune_budget is None
    with pytest.raises(ValueError, match="'tune_budget'.*>= 0"):
        config.set(tune_budget=-1)
    with pytest.raises(ValueError, match="'tune_budget'"):
        config.set(tune_budget=2.5)
