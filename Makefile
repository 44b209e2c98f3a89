# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# Pin torch to the CPU build; an unpinned torch pulls a multi-GB CUDA build.
	$(PY) -m pip install "torch==2.13.0"
	$(PY) -m pip install -e ".[test,fast]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/sparsefx demo

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) benchmarks/compile_time.py
	$(PY) benchmarks/train_step.py --floor
	$(PY) benchmarks/forward.py
	$(PY) benchmarks/step_profile.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis
