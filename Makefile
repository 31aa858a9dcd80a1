# Developer entry points: `make venv`, `make test`, `make demo`, `make lint`.

PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
# Rebuilt whenever pyproject.toml is newer than it, so a re-run with nothing changed is instant.
STAMP := $(VENV)/.minicomp-installed
TORCH_VERSION := 2.13.0
# Where this kind of machine keeps the CPU torch wheel; used only when the folder exists.
WHEELS := /opt/wheels
FIND_LINKS := $(if $(wildcard $(WHEELS)),--find-links $(WHEELS))
PYTEST_ARGS ?= -q -n 2
TESTS ?= tests

.PHONY: venv demo test test-full bench lint clean distclean

venv: $(STAMP)

$(VPY):
	$(PYTHON) -m venv $(VENV)

# torch goes in first and on its own: a plain `torch` requirement resolved with no torch
# installed would pull gigabytes of CUDA wheels.
$(STAMP): pyproject.toml | $(VPY)
	@$(VPY) -c 'import torch' 2>/dev/null || \
		$(VPY) -m pip install $(FIND_LINKS) torch==$(TORCH_VERSION)
	$(VPY) -m pip install -e '.[dev]'
	@touch $@

demo: venv
	$(VPY) examples/quickstart.py

test: venv
	$(VPY) -m pytest $(PYTEST_ARGS) $(TESTS)

# The full OpInfo sweep is marked `slow`; pyproject's addopts leave it out by default.
test-full: venv
	MINICOMP_FULL_SWEEP=1 $(VPY) -m pytest $(PYTEST_ARGS) -m "slow or not slow" $(TESTS)

bench: venv
	$(VPY) benchmarks/cpu_bench.py

lint: venv
	$(VPY) -m ruff check .
	$(VPY) -m ruff format --check .

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
