# Every target bootstraps .venv from this project's own files (torch pinned to the CPU wheel 2.13.0) with the
# first Python >= 3.10 found: python3 when its version fits, else python3.13 ... python3.10 (or PYTHON=...).
FITS := import sys; sys.exit(sys.version_info < (3, 10))
PYTHON ?= $(firstword $(foreach p,python3 python3.13 python3.12 python3.11 python3.10,\
            $(shell command -v $(p) >/dev/null 2>&1 && $(p) -c '$(FITS)' 2>/dev/null && echo $(p))))
VENV := .venv
PY := $(VENV)/bin/python
BACKENDS ?= jax tensorflow torch
DEMO_ARGS ?= --overwrite

.PHONY: python venv test rounds demo bench docs clean

# The first line of every target's output: which Python runs it (an older one is refused here).
python:
	@if [ -x $(PY) ]; then py=$(PY); else py="$(PYTHON)"; fi; \
	if [ -z "$$py" ] || ! $$py -c '$(FITS)' 2>/dev/null; then \
	  echo "keras-vit needs Python >= 3.10; found $$(python3 --version 2>&1 || echo 'no python3') (set PYTHON=/path/to/python3.x)"; \
	  exit 1; fi; \
	echo "keras-vit: Python $$($$py -c 'import platform; print(platform.python_version())') ($$(command -v $$py))"

# uv installs everything, unpacking and compiling in parallel, from the package sources pip is configured with (its
# index, extra indexes and find-links, every one equally: --index-strategy unsafe-best-match, as pip does; uv reads
# no pip configuration itself): where find-links holds torch 2.13.0's CPU wheel, that wheel.
PIP_SOURCES := import subprocess, sys; seen = []; \
  lines = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout; \
  [seen.append(arg) for key, _, value in (line.partition("=") for line in lines.splitlines()) \
   for option in [key.split(".", 1)[-1]] if option in ("index-url", "extra-index-url", "find-links") \
   for url in value.strip("\x27\x22").split() for arg in [f"--{option} {url}"] if arg not in seen]; print(*seen)
UV_INSTALL = $(PY) -m uv pip install --python $(PY) --quiet --compile-bytecode --index-strategy unsafe-best-match \
             $$(cat $(VENV)/pip-sources)
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet uv
	$(PY) -c '$(PIP_SOURCES)' > $(VENV)/pip-sources
	$(UV_INSTALL) "torch==2.13.0" -e ".[all]"
	$(UV_INSTALL) --no-deps "timm>=1.0"  # not torchvision (pyproject's convert extra says why)
	# LiteRT from torch: litert-torch and what converting imports, without its pins (keras_vit/export/formats.py says why)
	$(UV_INSTALL) $$($(PY) -c 'import keras_vit.export as e; print(e.LITERT_TORCH_INSTALL.removeprefix("pip install "))')
	touch $@

venv: python $(VENV)/.installed

# torch runs every test; the other backends deselect the backend-independent ones (tables, numpy math, argument
# errors) and the one_backend script runs (examples/benchmarks end to end, whose layers are tested per backend):
# torch runs them fastest (eager, nothing to compile for the tiny models; docs/contributing.md has the figures).
# A backend's suite is mostly one core's work, so on the default three backends two lanes run side by side:
# tensorflow then jax-1of2 | torch then jax-2of2. "jax-KofN" is the K-th of N processes that share the backend's
# test files: each takes, whole, the next file (longest first by tests/durations.json) that no other has taken
# (tests/_claims.py), so a lane whose first backend ends early takes more of the shared files and the lanes end
# together whatever the machine's speed that day.
# Each run writes .test-logs/NAME.log, printed in order once all have ended; BACKENDS=... runs the backends named,
# one after the other, whole. TESTS=... picks test files (a run that TESTS leaves without a test passes: pytest's
# exit status 5). The run ends with each lane's time against LANE_BUDGET_MIN and the ten slowest tests
# (tests/_lane_report.py); a lane over it is said, not failed (docs/contributing.md, "Keeping the suite fast").
# XLA compiles the test runs (JAX's, and TensorFlow's jit-compiled fit and predict) without LLVM's optimisations
# and with its classic fusion code instead of the newer MLIR fusion emitters: most of the jax runs' time was
# compiling the tiny test models (docs/contributing.md, "Keeping the suite fast", has the figures); the
# computation is the same, its code slower to run.
# tests/test_parity.py checks the official outputs once under XLA's default flags too. Set only where not empty:
# XLA stops a process at once on an empty flag (XLA_FLAGS=" " ended TensorFlow's jit-compiled tests with no message).
TEST_XLA_FLAGS ?= --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true \
                  --xla_cpu_use_fusion_emitters=false
# Lanes side by side compute on one thread each (torch's OpenMP pool, TensorFlow's and XLA's intra-op pools): two
# lanes and their tests' subprocesses on the 2 cores otherwise oversubscribe them (docs/contributing.md has the figures).
LANE_THREADS_ENV ?= OMP_NUM_THREADS=1 TF_NUM_INTRAOP_THREADS=1
LANE_THREADS_XLA ?= --xla_cpu_multi_thread_eigen=false
# The runs write bytecode whatever the environment says (PYTHONDONTWRITEBYTECODE unset): each test's subprocess then
# reads the package's compiled modules, and pytest's rewritten test modules are compiled once, not in every run.
TESTS ?= tests
LANE_BUDGET_MIN ?= 25
LANES ?= $(if $(filter command line environment,$(origin BACKENDS)),$(subst $(eval) ,+,$(strip $(BACKENDS))),tensorflow+jax-1of2 torch+jax-2of2)
test: python venv
	@rm -rf .test-logs && mkdir .test-logs; \
	echo "=== pytest, lanes side by side: $(LANES) (logs in .test-logs/) ==="; \
	for lane in $(LANES); do \
	  ( lane_start=$$(date +%s); \
	    for run in $$(echo $$lane | tr + ' '); do \
	      b=$${run%%-*}; shard=$$(echo $$run | sed -n 's/^[a-z]*-\([0-9]*\)of\([0-9]*\)$$/\1\/\2/p'); \
	      if [ $$b = torch ]; then only=""; else only="not backend_independent and not one_backend"; fi; \
	      xla=$$(echo $(TEST_XLA_FLAGS) $(if $(word 2,$(LANES)),$(LANE_THREADS_XLA)) $${XLA_FLAGS:-}); \
	      start=$$(date +%s); \
	      ( if [ -n "$$xla" ]; then export XLA_FLAGS="$$xla"; fi; \
	        $(if $(word 2,$(LANES)),export $(LANE_THREADS_ENV);) unset PYTHONDONTWRITEBYTECODE; \
	        KERAS_BACKEND=$$b KERAS_VIT_TEST_SHARD=$$shard KERAS_VIT_TEST_CLAIMS=$(CURDIR)/.test-logs/$$b.claims exec $(PY) -m pytest -q -p no:cacheprovider --durations=15 \
	        --junitxml=.test-logs/$$run.xml -m "$$only" $(TESTS) ) > .test-logs/$$run.log 2>&1; code=$$?; \
	      if [ $$code = 5 ] && [ -n "$$shard" ]; then code=0; fi; \
	      if [ $$code != 0 ]; then touch .test-logs/$$run.failed; break; fi; \
	      echo "=== KERAS_BACKEND=$$b $${shard:+(process $$shard of those sharing its test files) }passed in $$(( ($$(date +%s) - start) / 60 )) min ==="; \
	    done; echo $$(( $$(date +%s) - lane_start )) > .test-logs/$$lane.seconds ) & \
	done; wait; \
	for run in $$(echo $(LANES) | tr + ' '); do echo "=== pytest: $$run ==="; cat .test-logs/$$run.log; done; \
	$(PY) tests/_lane_report.py .test-logs $(LANE_BUDGET_MIN) $(LANES); \
	if ls .test-logs/*.failed >/dev/null 2>&1; then echo "FAILED on: $$(cd .test-logs && ls *.failed | sed 's/.failed//')"; exit 1; fi

# The tests that start several processes or depend on timing, ROUNDS times (20) under CI's load: tests/rounds.sh.
rounds: python venv
	PY=$(PY) XLA="$(TEST_XLA_FLAGS) $(LANE_THREADS_XLA)" ROUNDS=$${ROUNDS:-20} bash tests/rounds.sh

demo: python venv
	KERAS_BACKEND=$${KERAS_BACKEND:-jax} $(PY) examples/demo.py $(DEMO_ARGS)

bench: python venv
	$(PY) benchmarks/benchmark.py

# The documentation site (mkdocs.yml, docs/ and the docstrings) into site/; any warning (a broken link or
# anchor, a page missing from the nav, a docstring mkdocstrings cannot read) fails the build.
docs: python venv
	NO_MKDOCS_2_WARNING=1 KERAS_BACKEND=$${KERAS_BACKEND:-jax} $(PY) -m mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) runs site
