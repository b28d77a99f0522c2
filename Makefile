# gen_pipeline: every target sets up its own venv on first use (Python 3.11+).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
SPECFORGE_PIN := specforge==0.2.0
STAMP  := $(VENV)/.installed

DATASET    ?=
SERVER_URL ?=
SERVER     ?=
LIMIT      ?=
ARGS       ?=
FORMAT     ?= specforge
OUT        ?=

.PHONY: venv generate status demo test bench-test chaos slurm-test bench validate plan check export clean probe-kv report diagnose contract

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	# SpecForge's own loader of pre-tokenized rows (specforge/data/prompt_builder.py imports only the
	# standard library) for tests/test_export_tokens.py; --no-deps: its dependencies are torch, sglang, ...
	$(PY) -m pip install -q --no-deps $(SPECFORGE_PIN)
	@touch $(STAMP)

generate: $(STAMP)
	@test -n "$(DATASET)" || { echo "usage: make generate DATASET=B2|B1,B2,B6,B7|all [SERVER_URL=http://host:30000] [SERVER=sim] [LIMIT=N]"; exit 2; }
	$(PY) -m gen_pipeline generate --dataset $(DATASET) \
		$(if $(SERVER_URL),--server-url $(SERVER_URL)) \
		$(if $(SERVER),--server $(SERVER)) \
		$(if $(LIMIT),--limit $(LIMIT)) $(ARGS)

# read-only targets run silently (@): `make status ARGS=--json | jq` gets only the JSON
status: $(STAMP)
	@$(PY) -m gen_pipeline status $(ARGS)

validate: $(STAMP)
	@test -n "$(DATASET)" || { echo "usage: make validate DATASET=B2"; exit 2; }
	@$(PY) -m gen_pipeline validate --dataset $(DATASET) $(ARGS)

plan: $(STAMP)
	@$(PY) -m gen_pipeline plan $(ARGS)

check: $(STAMP)
	@test -n "$(DATASET)" || { echo "usage: make check DATASET=B2 [SERVER=tuned]"; exit 2; }
	@$(PY) -m gen_pipeline check --dataset $(DATASET) $(if $(SERVER),--server $(SERVER)) $(ARGS)

probe-kv: $(STAMP)
	@test -n "$(DATASET)" || { echo "usage: make probe-kv DATASET=B2 [ARGS='--server-url A --compare-url B --samples 200']"; exit 2; }
	$(PY) -m gen_pipeline probe-kv --dataset $(DATASET) $(ARGS)

export: $(STAMP)
	@test -n "$(OUT)" || { echo "usage: make export DATASET=B2 [DATASET='B1 B2'] OUT=exports/B2.jsonl [FORMAT=specforge|speculators|hf] [ARGS='--val-share 0.02 --expand-turns']"; exit 2; }
	$(PY) -m gen_pipeline export $(foreach d,$(DATASET),--dataset $(d)) --format $(FORMAT) --out $(OUT) $(ARGS)

report: $(STAMP)
	@test -n "$(DATASET)" || { echo "usage: make report DATASET=B2  (writes outputs/B2/report.html)"; exit 2; }
	$(PY) -m gen_pipeline report --dataset $(DATASET) $(ARGS)

diagnose: $(STAMP)
	@test -n "$(DATASET)" || { echo "usage: make diagnose DATASET=B2"; exit 2; }
	$(PY) -m gen_pipeline diagnose --dataset $(DATASET) $(ARGS)

demo: $(STAMP)
	$(PY) -m gen_pipeline generate --dataset demo --server sim
	$(PY) -m gen_pipeline status --dataset demo

# TEST_WORKERS pytest-xdist workers (most tests wait on real processes); TEST_WORKERS=0: one process
TEST_WORKERS ?= 4

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not bench and not slurm" -n $(TEST_WORKERS) --dist worksteal $(ARGS)

# the benchmarks' harnesses at a small scale (bench/ code paths, the GPU check's dry run) and the
# controller's throughput through the real pipeline (real-time figures); CI runs it
bench-test: $(STAMP)
	$(PY) -m pytest -q -m "bench and not slow" $(ARGS)

# ruff + mypy with the project's own config only (pyproject.toml explains the rules and strict modules)
.PHONY: lint
lint: $(STAMP)
	$(VENV)/bin/ruff check --config pyproject.toml .
	$(VENV)/bin/mypy --config-file pyproject.toml

chaos: $(STAMP)
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
