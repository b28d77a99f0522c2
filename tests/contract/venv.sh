#!/usr/bin/env bash
# Build (or reuse) the contract venv at $1: SGLang from tests/contract/requirements.txt plus this
# project with its test extra. Rebuilt only when the requirements or pyproject.toml change (the
# stamp holds their hash), so a venv outside the checkout (CI: ~/.cache) survives fresh clones.
set -euo pipefail
venv=${1:?usage: venv.sh VENV_DIR}
python=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
want=$(cat "$here/requirements.txt" "$root/pyproject.toml" | sha256sum | cut -c1-16)
if [ -f "$venv/.contract-stamp" ] && [ "$(cat "$venv/.contract-stamp")" = "$want" ]; then
  exit 0
fi
echo "building the contract venv in $venv (SGLang pinned in tests/contract/requirements.txt) ..."
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q)
sglang_pin=$(grep -E '^sglang==' "$here/requirements.txt")
"${pip[@]}" --no-deps "$sglang_pin"
# shellcheck disable=SC2046  # one pin a word
"${pip[@]}" --no-deps $(grep -E '#\s*no-deps' "$here/requirements.txt" | cut -d'#' -f1)
grep -vE '^sglang==|#\s*no-deps' "$here/requirements.txt" > "$venv/cpu-requirements.txt"
# The project's own dependencies (runtime + test extra), not the project: tests run from the
# checkout (python -m pytest puts it first on sys.path), so a cached venv fits every clone.
"$venv/bin/python" - "$root/pyproject.toml" >> "$venv/cpu-requirements.txt" <<'PY'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
extras, deps, todo = project["optional-dependencies"], list(project["dependencies"]), ["test"]
while todo:
    for dep in extras[todo.pop()]:
        if dep.startswith(project["name"] + "["):
            todo += dep[len(project["name"]) + 1:-1].split(",")
        else:
            deps.append(dep)
print("\n".join(deps))
PY
"${pip[@]}" -r "$venv/cpu-requirements.txt"
echo "$want" > "$venv/.contract-stamp"
