# Every target bootstraps .venv from this project's own files (Python 3.11, torch pinned to the CPU wheel 2.13.0).
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
BACKENDS ?= jax tensorflow torch
DEMO_ARGS ?= --overwrite

.PHONY: venv test demo bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[all]"
	$(PY) -m pip install --quiet --no-deps "timm>=1.0"  # not torchvision (pyproject's convert extra says why)
	touch $@

venv: $(VENV)/.installed

# jax runs every test; the other backends deselect the backend-independent ones (tables, numpy math, argument errors)
test: venv
	@set -e; for b in $(BACKENDS); do \
	  echo "=== pytest on KERAS_BACKEND=$$b ==="; \
	  if [ $$b = jax ]; then only=""; else only="not backend_independent"; fi; \
	  KERAS_BACKEND=$$b $(PY) -m pytest -q -p no:cacheprovider --durations=15 -m "$$only" tests || exit 1; \
	done

demo: venv
	KERAS_BACKEND=$${KERAS_BACKEND:-jax} $(PY) examples/demo.py $(DEMO_ARGS)

bench: venv
	$(PY) benchmarks/benchmark.py

clean:
	rm -rf $(VENV) runs
