# Two entry points: `make demo` and `make test`. Both create .venv if it is missing.
# torch is pinned first so that a CPU-only machine takes the CPU build and never the
# multi-GB CUDA wheels (TORCH may carry pip arguments, e.g. an index with CPU builds);
# on a GPU machine, set TORCH= to keep the torch you have, e.g.
#   make demo VENV_FLAGS=--system-site-packages TORCH=
PYTHON ?= python3
VENV ?= .venv
VENV_FLAGS ?=
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tilepilot-installed

.PHONY: demo test lint clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(if $(TORCH),$(PY) -m pip install -q $(TORCH))
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	rm -f out/demo.db out/demo.db-wal out/demo.db-shm
	mkdir -p out
	$(PY) -m tilepilot tune campaigns/demo.toml --backend replay --db out/demo.db
	$(PY) -m tilepilot best --db out/demo.db

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(PY) -m ruff check tilepilot tests bench

clean:
	rm -rf $(VENV) out .pytest_cache
