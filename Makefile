# The two commands of the README: `make prove` (the main job) and `make test`.
# Each creates the virtual environment first if it is missing.
VENV ?= .venv
PY := $(VENV)/bin/python

# torch: the CPU build, named explicitly (a bare "torch" requirement pulls a multi-GB CUDA build).
# A wheel already on disk (pip's find-links) is used offline; otherwise PyTorch's CPU index.
# To use a CUDA/NPU torch that is already installed instead: make test TORCH=system
TORCH ?= torch==2.13.0+cpu
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
VENV_ARGS := $(if $(filter system,$(TORCH)),--system-site-packages,)
# The suite runs under the best CPU vector path torch finds on this CPU (nothing forced); then the
# numerics-sensitive tests run again under every path below it, side by side on one thread each
# (tools/numerics_reruns.py asks torch which paths the CPU has: default and avx2 on an AVX-512 x86,
# default on an AVX2 one or on ARM). A path above the CPU's is never forced: torch dies with SIGILL on it.

.PHONY: prove prove-triton test bench ascend-check

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV_ARGS) $(VENV)
ifneq ($(TORCH),system)
	$(PY) -m pip install -q --no-deps --no-index "$(TORCH)" 2>/dev/null || \
		$(PY) -m pip install -q --no-deps --index-url $(TORCH_INDEX) "$(TORCH)"
	$(PY) -m pip install -q "$(TORCH)" -e '.[test]'  # torch's own dependencies, then ours
else
	$(PY) -m pip install -q -e '.[test]'
endif
	touch $@

prove: $(VENV)/.installed
	$(PY) -m attnformal.prove

# The forward, dQ and dK/dV Triton kernels proved from their TTIR, every shipped configuration (docs/ttir.md), one
# claim a line with the replay command of each refutation: what `make prove` proves as obligation 20.
TTIR_KERNELS := --triton attnformal.kernels.triton_flash:_attn_fwd --triton attnformal.kernels.triton_flash:_attn_bwd_dq \
	--triton attnformal.kernels.triton_flash:_attn_bwd_dkdv

prove-triton: $(VENV)/.installed
	env -u TRITON_INTERPRET TRITON_DEFAULT_FP_FUSION=1 $(PY) -m attnformal.prove $(TTIR_KERNELS)

# The main run spreads the tests over worker processes (pytest-xdist; one per core, at most 4: each
# worker holds its own torch), a module per worker (its fixtures and the wheel test-command builds stay in one
# process), and lists the slowest, so a test that grows shows in CI's log.
TEST_WORKERS ?= $(shell python3 -c "import os; print(min(os.cpu_count() or 1, 4))")

test: $(VENV)/.installed
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25
	$(PY) tools/numerics_reruns.py

bench: $(VENV)/.installed
	$(PY) benchmarks/bench_kernels.py

# The triton-ascend lowering gate (docs/ascend.md): every Triton kernel lowered to Linalg/HIVM for
# Ascend 910B, no NPU needed. triton-ascend replaces the `triton` package, so it has its own environment;
# its backend imports pybind11 and numpy without declaring them; pytest runs the negative controls.
ASCEND_VENV ?= .venv-ascend
ASCEND_PY := $(ASCEND_VENV)/bin/python
TRITON_ASCEND ?= triton-ascend==3.2.0

$(ASCEND_VENV)/.installed: pyproject.toml
	python3 -m venv $(ASCEND_VENV)
	$(ASCEND_PY) -m pip install -q --no-deps --no-index "$(TORCH)" 2>/dev/null || \
		$(ASCEND_PY) -m pip install -q --no-deps --index-url $(TORCH_INDEX) "$(TORCH)"
	$(ASCEND_PY) -m pip install -q "$(TORCH)" "$(TRITON_ASCEND)" pybind11 numpy pytest
	$(ASCEND_PY) -m pip install -q -e .  # our own dependencies (z3, sympy, ...); torch is there already
	touch $@

# The lowering gate, then the same TTIR theorems as `make prove-triton` on the TTIR triton-ascend's front end
# emits (the kernel it lowers is the kernel proven), the gate's negative controls, and the planted TTIR bugs.
ascend-check: $(ASCEND_VENV)/.installed
	TRITON_INTERPRET=0 $(ASCEND_PY) tools/ascend_check.py
	TRITON_INTERPRET=0 $(ASCEND_PY) -m attnformal.prove --triton-target ascend $(TTIR_KERNELS)
	TRITON_INTERPRET=0 $(ASCEND_PY) -m pytest -q -p no:attnformal.verify.pytest_plugin tests/kernels/test_ascend_lowering.py
	TRITON_INTERPRET=0 ATTNFORMAL_TTIR_TARGET=ascend $(ASCEND_PY) -m pytest -q -p no:attnformal.verify.pytest_plugin \
	  tests/ttir/test_theorems.py -k "planted or block_pointer"  # the planted bugs, refuted on triton-ascend's TTIR too; block pointers
