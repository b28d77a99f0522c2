#!/usr/bin/env bash
# The GPU check (issue 9) on a CUDA machine with no network: install SGLang 0.5.17 from wheels, make a
# random-weight 1.2B Llama, run bench/gpu/h200_check.py phases against it, copy the results to OUT.
#
# Usage: bench/gpu/run_h200.sh KEEP OUT PHASE [PHASE ...]
#   KEEP  a folder that outlives the calls: holds p1 p2 p3 (../shared/gpu/fetch_wheels.sh makes them),
#         gets wheels/, work/ (model, configs, outputs, results.json)
#   OUT   where results.json, the driver log and a tarball of the run logs are copied
#   PHASE install | model | any phase of bench/gpu/h200_check.py (setup serve sweep adaptive regimes
#         kill unserve launch frontend starved probe tune summary)
# Everything is idempotent: a second call skips what is already installed or built.
set -uo pipefail
keep=${1:?usage: run_h200.sh KEEP OUT PHASE...}; out=${2:?usage: run_h200.sh KEEP OUT PHASE...}; shift 2
here=$(cd "$(dirname "$0")/../.." && pwd)   # the gen_pipeline checkout this script is in
site=${SITE:-/tmp/site}
export PYTHONPATH="$site:$here" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
export SGLANG_DISABLE_REQUEST_LOGGING=1 NCCL_NVLS_ENABLE=0   # never NVLS (issue 9): shared hosts
py=${PYTHON:-python3}
mkdir -p "$out" "$keep/work"
log="$out/driver.log"
stamp() { echo "[run_h200 $(date -u +%H:%M:%S)] $*" >>"$log"; }
check=()
for phase in "$@"; do
  case "$phase" in
    install)
      if [ -f "$site/sglang/__init__.py" ]; then stamp "SGLang already in $site"; continue; fi
      stamp "unpacking wheels"
      cat "$keep"/p1 "$keep"/p2 "$keep"/p3 | tar -x -C "$keep" || { stamp "wheel parts missing"; exit 3; }
      stamp "installing $(ls "$keep"/wheels/*.whl | wc -l) wheels into $site"
      "$py" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$keep"/wheels/*.whl >>"$log" 2>&1 \
        || { stamp "pip install failed"; exit 3; }
      "$py" -c "import sglang, torch; print('sglang', sglang.__version__, 'torch', torch.__version__, torch.cuda.get_device_name())" >>"$log" 2>&1
      ;;
    model)
      for shape in 1.2b small; do
        dir="$keep/work/model"; [ "$shape" = small ] && dir="$keep/work/model-small"
        if [ -f "$dir/config.json" ] && grep -q '"max_position_embeddings": 8192' "$dir/config.json"; then
          stamp "model $shape already built"; continue
        fi
        stamp "building the random-weight model ($shape)"
        (cd "$here" && "$py" -m bench.gpu.make_model "$dir" --shape "$shape") >>"$log" 2>&1 || { stamp "model build failed"; tail -20 "$log"; exit 3; }
        tail -1 "$log"
      done
      ;;
    *) check+=("$phase") ;;
  esac
done
if [ ${#check[@]} -gt 0 ]; then
  stamp "h200_check ${check[*]}"
  (cd "$here" && "$py" -m bench.gpu.h200_check --work "$keep/work" --budget-s "${BUDGET_S:-560}" ${CHECK_ARGS:-} "${check[@]}") >>"$log" 2>&1
fi
cp "$keep/work/results.json" "$out/h200_results.json" 2>/dev/null
cp "$keep/work/traces.json" "$out/h200_traces.json" 2>/dev/null   # per-second server traces (phase regimes)
tar -czf "$out/logs.tar.gz" -C "$keep/work" logs 2>/dev/null
stamp "done"
tail -c 8000 "$log"   # the log is a file, not a pipe: a detached server must not hold our output open
