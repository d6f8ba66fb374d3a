# The two commands of the README: `make prove` (the main job) and `make test`.
# Each creates the virtual environment first if it is missing.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: prove test bench

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	# The CPU wheel, explicitly: a bare "torch" requirement would pull a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $@

prove: $(VENV)/.installed
	$(PY) -m attnformal.prove

test: $(VENV)/.installed
	$(PY) -m pytest -q

bench: $(VENV)/.installed
	$(PY) benchmarks/bench_kernels.py
