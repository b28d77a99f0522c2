# gen_pipeline: every target sets up its own venv on first use (Python 3.11+).
#
# Which venv and what goes into it (docs/install.md):
#   VENV=DIR        the venv every target runs (default .venv); `export VENV=...` to keep one for a shell
#   EXTRAS=a,b      the pyproject extras `make venv` installs (default: what the venv was made with, else
#                   test); on the GPU node: make venv EXTRAS=gpu (SGLang 0.5.17 and what every target needs)
#   PIP_ARGS=...    extra pip options, e.g. an offline node: PIP_ARGS="--no-index --find-links /data/wheels"
#   VENV_ARGS=...   options of `python -m venv`, e.g. --system-site-packages to use the image's own torch
# The extras installed are recorded in $(VENV)/.installed: asking for others reinstalls, and every later
# target keeps them (make generate after make venv EXTRAS=gpu does not reinstall without sglang).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
SPECFORGE_PIN := specforge==0.2.0
STAMP  := $(VENV)/.installed
comma  := ,
# An empty stamp is one written before the stamp recorded its extras: those venvs had the test extra.
INSTALLED := $(if $(wildcard $(STAMP)),$(or $(strip $(shell cat $(STAMP))),test))
EXTRAS    ?= $(or $(INSTALLED),test)
PIP_ARGS  ?=
VENV_ARGS ?=
# the exact command that adds the GPU install to the venv make runs, keeping its other extras (test,sglang ->
# test,gpu): the launcher's "sglang is not installed" names it
empty :=
space := $(empty) $(empty)
GPU_EXTRAS := $(subst $(space),$(comma),$(strip $(filter-out sglang gpu,$(subst $(comma), ,$(EXTRAS))) gpu))
generate probe-kv tune: export GEN_PIPELINE_MAKE_SGLANG := make venv $(if $(filter-out .venv,$(VENV)),VENV=$(VENV) )EXTRAS=$(GPU_EXTRAS)

DATASET    ?=
SERVER_URL ?=
SERVER     ?=
LIMIT      ?=
ARGS       ?=
FORMAT     ?= specforge
OUT        ?=
# --config-dir / --output-dir of every command (default datasets_cfg/ and outputs/)
CONFIG_DIR ?=
OUTPUT_DIR ?=
DIRS := $(if $(CONFIG_DIR),--config-dir $(CONFIG_DIR)) $(if $(OUTPUT_DIR),--output-dir $(OUTPUT_DIR))

.PHONY: venv generate status demo demo-job test e2e bench-test chaos slurm-test bench validate plan check export clean probe-kv tune report diagnose contract docs FORCE

venv: $(STAMP)

ifneq ($(EXTRAS),$(INSTALLED))
$(STAMP): FORCE
endif

$(STAMP): pyproject.toml
	@test -x $(PY) || $(MAKE) --no-print-directory $(VENV)/pyvenv.cfg
	$(if $(findstring --no-index,$(PIP_ARGS)),,$(PY) -m pip install -q $(PIP_ARGS) --upgrade pip)
	$(PY) -m pip install -q $(PIP_ARGS) -e '.[$(EXTRAS)]'
	# SpecForge's own loader of pre-tokenized rows (specforge/data/prompt_builder.py imports only the
	# standard library) for tests/export/test_export_tokens.py; --no-deps: its dependencies are torch, sglang, ...
	$(if $(filter test,$(subst $(comma), ,$(EXTRAS))),$(PY) -m pip install -q $(PIP_ARGS) --no-deps $(SPECFORGE_PIN))
	@echo '$(EXTRAS)' > $(STAMP)

FORCE:

# The venv itself. With --system-site-packages from an interpreter that is itself a venv (a CUDA image's
# /opt/torch/.venv/bin/python3, as on the lent H200), Python links the new venv to the *base* interpreter's
# site-packages, not that venv's: torch and numpy vanish. A .pth file adds the parent venv's site-packages
# after the new venv's own (so what pip installs here still shadows the image's).
CHAIN_SITE := import pathlib, site, sys; sys.prefix != sys.base_prefix and pathlib.Path(sys.argv[1], "zz_parent_venv_site.pth").write_text("\n".join(site.getsitepackages()) + "\n")
$(VENV)/pyvenv.cfg:
	$(PYTHON) -m venv $(VENV_ARGS) $(VENV)
	$(if $(findstring --system-site-packages,$(VENV_ARGS)),$(PYTHON) -c '$(CHAIN_SITE)' "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')")

generate: $(STAMP)
	@test -n "$(DATASET)" || { echo "usage: make generate DATASET=B2|B1,B2,B6,B7|all [SERVER_URL=http://host:30000] [SERVER=sim] [LIMIT=N]"; exit 2; }
	$(PY) -m gen_pipeline generate --dataset $(DATASET) \
		$(if $(SERVER_URL),--server-url $(SERVER_URL)) \
		$(if $(SERVER),--server $(SERVER)) \
		$(if $(LIMIT),--limit $(LIMIT)) $(DIRS) $(ARGS)

# read-only targets run silently (@): `make status ARGS=--json | jq` gets only the JSON
status: $(STAMP)
	@$(PY) -m gen_pipeline status $(DIRS) $(ARGS)

validate: $(STAMP)
	@test -n "$(DATASET)" || { echo "usage: make validate DATASET=B2"; exit 2; }
	@$(PY) -m gen_pipeline validate --dataset $(DATASET) $(DIRS) $(ARGS)

plan: $(STAMP)
	@$(PY) -m gen_pipeline plan $(DIRS) $(ARGS)

check: $(STAMP)
	@test -n "$(DATASET)" || { echo "usage: make check DATASET=B2 [SERVER=tuned]"; exit 2; }
	@$(PY) -m gen_pipeline check --dataset $(DATASET) $(if $(SERVER),--server $(SERVER)) $(DIRS) $(ARGS)

probe-kv: $(STAMP)
	@test -n "$(DATASET)" || { echo "usage: make probe-kv DATASET=B2 [ARGS='--server-url A --compare-url B --samples 200']"; exit 2; }
	$(PY) -m gen_pipeline probe-kv --dataset $(DATASET) $(DIRS) $(ARGS)

tune: $(STAMP)
	@test -n "$(DATASET)" || { echo "usage: make tune DATASET=B2 [SERVER=tuned] [ARGS='--levers kv_cache_dtype,cuda_graph_max_bs --budget-share 0.05']"; exit 2; }
	$(PY) -m gen_pipeline tune --dataset $(DATASET) $(if $(SERVER),--server-profile $(SERVER)) $(DIRS) $(ARGS)

export: $(STAMP)
	@test -n "$(OUT)" || { echo "usage: make export DATASET=B2 [DATASET='B1 B2'] OUT=exports/B2.jsonl [FORMAT=specforge|speculators|hf] [ARGS='--val-share 0.02 --expand-turns']"; exit 2; }
	$(PY) -m gen_pipeline export $(foreach d,$(DATASET),--dataset $(d)) --format $(FORMAT) --out $(OUT) $(DIRS) $(ARGS)

report: $(STAMP)
	@test -n "$(DATASET)" || { echo "usage: make report DATASET=B2  (writes outputs/B2/report.html)"; exit 2; }
	$(PY) -m gen_pipeline report --dataset $(DATASET) $(DIRS) $(ARGS)

diagnose: $(STAMP)
	@test -n "$(DATASET)" || { echo "usage: make diagnose DATASET=B2"; exit 2; }
	$(PY) -m gen_pipeline diagnose --dataset $(DATASET) $(DIRS) $(ARGS)

demo: $(STAMP)
	$(PY) -m gen_pipeline generate --dataset demo --server sim
	$(PY) -m gen_pipeline status --dataset demo

# The reference job's shape offline: B1/B2/B6/B7-shaped bundled sources (datasets_cfg/offline/, written by
# datasets_cfg/offline/data/make_offline.py) through one simulator, into outputs/offline/. Then, e.g.:
#   make status CONFIG_DIR=datasets_cfg/offline OUTPUT_DIR=outputs/offline
OFFLINE := --config-dir datasets_cfg/offline --output-dir outputs/offline
demo-job: $(STAMP)
	$(PY) -m gen_pipeline generate --dataset all --server sim $(OFFLINE) $(if $(LIMIT),--limit $(LIMIT)) $(ARGS)
	$(PY) -m gen_pipeline status $(OFFLINE)

# TEST_WORKERS pytest-xdist workers for `make test` (the tests run the CLI in-process: 2 fit 2 cores);
# E2E_WORKERS for `make e2e` (its tests mostly wait on real processes); 0: one process
TEST_WORKERS ?= 2
E2E_WORKERS  ?= 4
# the targets that need the test extra's tools (pytest, ruff, mypy) say how to get them
need_test = $(if $(filter test,$(subst $(comma), ,$(EXTRAS))),,$(error $(VENV) has the extras $(EXTRAS), without \
	the test tools: make venv EXTRAS=test$(comma)$(EXTRAS)))

test: $(STAMP)
	$(need_test)
	$(PY) -m pytest -q -m "not slow and not bench and not slurm and not e2e" -n $(TEST_WORKERS) --dist worksteal $(ARGS)

# the tests whose subject is a real process: signals, SIGKILL and resume, pipes, tmpfs, the launcher,
# servers that die or freeze, the router (tests/e2e/ and tests marked e2e); CI runs it
e2e: $(STAMP)
	$(need_test)
	$(PY) -m pytest -q -m "e2e and not slow and not bench and not slurm" -n $(E2E_WORKERS) --dist worksteal $(ARGS)

# the benchmarks' harnesses at a small scale (bench/ code paths, the GPU check's dry run) and the
# controller's throughput through the real pipeline (real-time figures); CI runs it
bench-test: $(STAMP)
	$(need_test)
	$(PY) -m pytest -q -m "bench and not slow" $(ARGS)

# the docs site (mkdocs.yml, docs/) into site/; --strict: a dead link or anchor fails the build. mkdocs comes with
# the test extra (through its docs extra).
docs: $(STAMP)
	$(if $(filter test docs,$(subst $(comma), ,$(EXTRAS))),,$(error $(VENV) has the extras $(EXTRAS), without 	mkdocs: make venv EXTRAS=docs$(comma)$(EXTRAS)))
	$(PY) -m mkdocs build --strict --quiet

# ruff + mypy with the project's own config only (pyproject.toml explains the rules and strict modules)
.PHONY: lint
lint: $(STAMP)
	$(need_test)
	$(VENV)/bin/ruff check --config pyproject.toml .
	$(VENV)/bin/mypy --config-file pyproject.toml

chaos: $(STAMP)
	$(need_test)
	$(PY) -m pytest -q -m "slow and not slurm" $(ARGS)

# The README's sbatch script under a real single-node SLURM: tests/slurm/cluster.sh installs slurm-wlm
# (apt-get, as root) when missing, starts munged + slurmctld + slurmd under $(SLURM_DIR), and stops them
# after. SLURM=1 skips (saying why) where no cluster can start; SLURM=require (CI) fails instead.
SLURM     ?= 1
SLURM_DIR ?= /tmp/gen-pipeline-slurm

slurm-test: $(STAMP)
	GEN_PIPELINE_SLURM=$(SLURM) GEN_PIPELINE_SLURM_DIR=$(SLURM_DIR) $(PY) -m pytest -q -m slurm tests/slurm $(ARGS)

# SGLang's own code (the release pinned in tests/contract/requirements.txt) checks ours: launch
# flags, metric/loads/server_info fields, protocol models. Its own venv, rebuilt only when the pins
# change (CONTRACT_VENV may live outside the checkout: .ci/run keeps it in ~/.cache).
CONTRACT_VENV ?= .venv-contract

contract:
	PYTHON=$(PYTHON) bash tests/contract/venv.sh $(CONTRACT_VENV)
	GEN_PIPELINE_CONTRACT=1 $(CONTRACT_VENV)/bin/python -m pytest -q -p no:cacheprovider \
		-o filterwarnings= tests/contract $(ARGS)

bench: $(STAMP)
	$(PY) -m bench $(ARGS)

clean:
	rm -rf $(VENV) .venv-contract build *.egg-info
