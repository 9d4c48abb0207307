# scone_jax: every target creates or refreshes the virtual environment it needs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_WORKERS ?= 2
FAKE_DEVICES := XLA_FLAGS=--xla_force_host_platform_device_count=8

.PHONY: venv demo test test-slow test-all test-faults test-multihost test-sweeps test-slurm test-beam test-fidelity test-plans bench gpu-check lint clean

venv:
	@want=$$($(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "need Python >= 3.11"; print("%d.%d" % sys.version_info[:2])') \
	  || { echo "error: PYTHON=$(PYTHON) is not a runnable Python >= 3.11" >&2; exit 1; }; \
	have=$$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true); \
	if [ "$$want" != "$$have" ]; then \
	  echo "creating $(VENV) with $(PYTHON) ($$want)"; rm -rf $(VENV); $(PYTHON) -m venv $(VENV) || exit 1; fi; \
	if [ ! -f $(STAMP) ] || [ setup.cfg -nt $(STAMP) ] || [ pyproject.toml -nt $(STAMP) ]; then \
	  echo "installing scone_jax and its dependencies into $(VENV)"; \
	  $(PY) -m pip install -q --upgrade pip && \
	  $(PY) -m pip install -q -e '.[test,dev,beam,hf]' && touch $(STAMP) || exit 1; fi

demo: venv
	$(VENV)/bin/scone-jax demo --out demo_out

test: venv
	$(FAKE_DEVICES) $(PY) -m pytest -n $(PYTEST_WORKERS) -q

test-slow: venv
	$(FAKE_DEVICES) $(PY) -m pytest -n $(PYTEST_WORKERS) -q -m slow

test-all: test test-slow

# 2 processes x 4 devices == 1 process x 8 devices: training through a lost peer and a resume, export (about 4 minutes)
test-multihost: venv
	$(FAKE_DEVICES) $(PY) -m pytest -q -m slow tests/multihost

# a whole sweep end to end: runs, skips what is done, resumes, reports (about 4 minutes)
test-sweeps: venv
	$(FAKE_DEVICES) $(PY) -m pytest -q -m slow tests/sweep

# a real SLURM cluster on 127.0.0.1 (Debian's slurm-wlm and munge, installed when missing; needs
# root): submit, a time limit, preemption, requeue and a lost node (tests/slurm; about 9 minutes)
test-slurm: venv
	tests/slurm/install_slurm.sh
	$(PY) -m pytest -q -m slurm tests/slurm

# f-gram counting on Beam's FnApi runner with 2 SDK worker processes, offline, against the local
# backend on a corpus of many shards (about half a minute)
test-beam: venv
	$(PY) -m pytest -q -m slow tests/fgrams/test_beam_workers.py

# the shipped SCONE presets against their baselines on the embedded corpus, 3 fresh seeds per
# family (docs/fidelity.md; about 15 minutes on 2 cores)
test-fidelity: venv
	$(PY) -m pytest -n 2 -q -m slow tests/fidelity

# the paper presets compiled at their own batch on their documented device count (fake CPU
# devices; docs/training.md), and rematerialization's saving (compiled, never run: about 30 s
# on 2 cores)
test-plans: venv
	$(FAKE_DEVICES) $(PY) -m pytest -q -m slow tests/train/test_plan_presets.py

# the fault-injection suite (docs/reliability.md): kills, torn writes, corruption, full disk, a second
# writer, a lost peer (about 10 minutes; the bad-input catalogue runs in make test)
test-faults: venv
	$(FAKE_DEVICES) $(PY) -m pytest -q -m slow tests/reliability

bench: venv
	$(PY) -m benchmarks.run_all --out BENCHMARKS.md

# On a lent GPU machine (no network, Python 3.12 with jax): wheels its image lacks travel in .whl
# (benchmarks/gpu_wheels.sh fetches them here); results go to $OUT/gpu_check.md (GPU_CHECK_ARGS="--parts scone --quick" for less).
GPU_PYTHON ?= python3
gpu-check:
	@if ls .whl/*.whl >/dev/null 2>&1; then \
	  $(GPU_PYTHON) -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
	    --target /tmp/scone-site .whl/*.whl || exit 1; fi; \
	PYTHONPATH=/tmp/scone-site$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PYTHON) -m benchmarks.gpu_check $(GPU_CHECK_ARGS)

LINT_PATHS := scone_jax tests benchmarks experiments launch

# ruff check (pyproject.toml's rules, line length 100 included), then the formatter's check
lint: venv
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)

clean:
	rm -rf $(VENV) demo_out bench_out .pytest_cache
