#!/usr/bin/env bash
# The GPU user's path (issue 23), as docs/gpu-node.md and docs/install.md write it, on one GPU with no network:
# install with SGLang (make venv EXTRAS=gpu, offline), the weights on local disk (the small random model
# of bench/gpu/make_model.py stands in for Kimi-K2.5's ~600 GB), plan, a short job of the four offline
# datasets (datasets_cfg/offline/) launched by `make generate` and run detached (nohup, log kept),
# status, validate, export.
#
# Usage: bench/gpu/user_path.sh [--sim] KEEP OUT
#   KEEP   a folder that outlives the calls: p1 p2 p3 (../shared/gpu/fetch_wheels.sh) or wheels/ already
#          unpacked; gets work/model (the random model, shared with run_h200.sh) and work/user_path/
#   OUT    where user_path.log, the job's generate.log and the export are copied
#   --sim  dry run on a machine without GPU: no wheels, no model, no new venv (the checkout's .venv),
#          the simulator as the server; every make command is the same
# Env: VENV (default .venv), PYTHON (the image's python3 for the venv), GPU_MEM_GB (plan; H200: 140.4).
# Exit 0 only when every step passed; the last line says which step failed otherwise.
set -uo pipefail
sim=0
if [ "${1:-}" = "--sim" ]; then sim=1; shift; fi
keep=${1:?usage: user_path.sh [--sim] KEEP OUT}; out=${2:?usage: user_path.sh [--sim] KEEP OUT}
here=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out" "$keep/work" && keep=$(cd "$keep" && pwd) && out=$(cd "$out" && pwd)
work="$keep/work/user_path"; cfg="$work/cfg"; outputs="$work/outputs"; model="$keep/work/model"
venv=${VENV:-.venv}
log="$out/user_path.log"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
cd "$here" || exit 3
: >"$log"
step() { echo "[user_path $(date -u +%H:%M:%S)] $*" | tee -a "$log"; }
fail() { step "FAILED: $*"; tail -n 30 "$log" >&2; exit 1; }
run() { step "\$ $*"; "$@" >>"$log" 2>&1 || fail "$*"; }

# 1. install: SGLang's wheels into a venv that sees the image's torch, then make venv EXTRAS=gpu
#    (docs/install.md, "On the GPU node": the offline node). make records the extras: later targets keep them.
if [ $sim = 0 ]; then
  if [ ! -d "$keep/wheels" ]; then
    step "unpacking the wheels"
    cat "$keep"/p1 "$keep"/p2 "$keep"/p3 | tar -x -C "$keep" || fail "unpack $keep/p1 p2 p3"
  fi
  py=${PYTHON:-python3}
  venv_args=--system-site-packages
  # an image without ensurepip (Debian's python3 without python3-venv): the venv uses the image's pip
  "$py" -c "import ensurepip" 2>/dev/null || { venv_args="$venv_args --without-pip"; step "no ensurepip: $venv_args"; }
  # --no-build-isolation builds our editable install with the image's setuptools: it needs bdist_wheel
  # (setuptools >= 70.1, or the wheel package); torch on Python 3.12 brings setuptools
  "$py" -c "import setuptools.command.bdist_wheel" 2>/dev/null || "$py" -c "import wheel" 2>/dev/null \
    || fail "$py has no setuptools >= 70.1 (nor wheel) to build the checkout offline: add a setuptools wheel to $keep/wheels"
  if [ -f "$venv/pyvenv.cfg" ] && ! grep -q "include-system-site-packages = true" "$venv/pyvenv.cfg"; then
    fail "$venv exists without --system-site-packages (it cannot see the image's torch): remove it or set VENV"
  fi
  run make venv EXTRAS=gpu VENV="$venv" PYTHON="$py" VENV_ARGS="$venv_args" \
      PIP_ARGS="--no-index --no-deps --no-build-isolation"
  run "$venv/bin/python" -m pip install -q --no-index --no-deps --no-compile "$keep"/wheels/*.whl
  # SGLang on the GPU, and every runtime dependency of ours (the image's or the wheels'): a missing one is named here
  run "$venv/bin/python" -c "import sglang, torch; print('sglang', sglang.__version__, 'torch', torch.__version__, \
torch.cuda.get_device_name())"
  run "$venv/bin/python" -c "import anyio, datasets, httpx, orjson, prometheus_client, pydantic, tenacity, tqdm, \
gen_pipeline.cli; print('gen_pipeline dependencies import')"
else
  run make venv VENV="$venv"
fi

# 2. the weights on local disk: a model folder (config.json, safetensors, tokenizer) that model_path names
if [ $sim = 0 ] && ! grep -qs '"max_position_embeddings": 8192' "$model/config.json"; then
  run "$venv/bin/python" -m bench.gpu.make_model "$model"
fi
if [ $sim = 1 ]; then  # no weights in a dry run: the random model's config.json only, for plan
  mkdir -p "$model" && cat >"$model/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16,
 "num_key_value_heads": 4, "max_position_embeddings": 8192}
JSON
fi
step "disk: $(df -h --output=avail,target "$keep" | tail -1) free; model $(du -sh "$model" 2>/dev/null | cut -f1)"

# 3. the config dir: the four offline datasets and a server.toml whose profile points at the local model
rm -rf "$work" && mkdir -p "$cfg" "$outputs" && cp -r datasets_cfg/offline/B*.toml datasets_cfg/offline/data "$cfg/"
if [ $sim = 0 ]; then
  server_cmd=''; extra='["--attention-backend", "triton", "--sampling-backend", "pytorch", "--dtype", "bfloat16"]'
else
  server_cmd=$'command = ["{python}", "-m", "sglang_sim"]\nbackend = "sim"'
  extra='["--sim-profile", "h200", "--time-scale", "10", "--sim-startup-s", "1", "--sim-output-mean", "128"]'
fi
cat >"$cfg/server.toml" <<EOF
# bench/gpu/user_path.sh: one GPU, the model on local disk (docs/gpu-node.md "Weights on local disk")
[profile.gpu]
model_path = "$model"
tp_size = 1
mem_fraction_static = 0.85
enable_metrics = true
host = "127.0.0.1"
port = 0
extra_args = $extra
startup_timeout_s = 900
health_interval_s = 2
stop_grace_s = 20
$server_cmd
EOF
dirs=(CONFIG_DIR="$cfg" OUTPUT_DIR="$outputs")

# 4. plan, then the job detached with its log kept (docs/gpu-node.md "Run it detached"), waited for here
run make plan "${dirs[@]}" ARGS="--server gpu --model-config $model/config.json --params-b 1.16 \
--weight-dtype bf16 --overhead-gb 2 --gpu-mem-gb ${GPU_MEM_GB:-140.4}"
step "\$ nohup make generate DATASET=all SERVER=gpu ${dirs[*]} > $outputs/generate.log 2>&1 &"
nohup make generate DATASET=all SERVER=gpu "${dirs[@]}" >"$outputs/generate.log" 2>&1 </dev/null &
job=$!
wait $job; rc=$?
cp "$outputs/generate.log" "$out/generate.log"
tail -n 8 "$outputs/generate.log" | tee -a "$log"
[ $rc = 0 ] || fail "make generate exited $rc (log: $out/generate.log)"

# 5. status, validate, export (into exports/ under the job's folder: make creates it)
run make status "${dirs[@]}"
for d in B1 B2 B6 B7; do run make validate DATASET=$d "${dirs[@]}"; done
run make export DATASET="B1 B2 B6 B7" OUT="$work/exports/job.jsonl" "${dirs[@]}"
rows=$(wc -l <"$work/exports/job.jsonl")
cp "$work/exports/job.jsonl" "$out/job.jsonl"
[ "$rows" = 110 ] || fail "the export holds $rows rows, not 110"
step "OK: install, launch, the 4-dataset job (110 samples), validate and export (110 rows) passed"
