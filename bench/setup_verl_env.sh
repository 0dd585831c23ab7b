#!/usr/bin/env bash
# The verl reference check's own virtualenv: bench/setup_verl_env.sh [VENV]
#   (default: .venv-verl at the repo root; PYTHON picks the interpreter, default python3)
#
# tests/rl/test_verl_reference.py runs verl 0.9.1's own loss, advantage and rollout-correction
# functions (verl/trainer/ppo/core_algos.py, verl/trainer/ppo/rollout_corr_helper.py) on random
# batches in this venv, through tests/trainer/verl_reference/verl_side.py, and compares them with
# agentrl's. verl lives only here, never in the project's .venv.
#
# What it installs: exactly the LOCK below, every package at a fixed version, with --no-deps, so
# nothing is resolved at install time and the env cannot drift:
#   * verl==0.9.1 itself without its dependencies (they include vLLM/SGLang, flash-attn, wandb...);
#   * torch==2.13.0, the CPU build (the local wheel directory, see `pip config list`), as in .venv;
#   * what `import verl.trainer.ppo.core_algos, verl.trainer.ppo.rollout_corr_helper` needs, found
#     by importing them until nothing was missing: packaging numpy tensordict omegaconf
#     transformers ray codetiming orjson, at verl 0.9.1's pins where it has them (tensordict 0.10.0,
#     transformers 5.10.4, the newest below its <5.11 cap). verl/__init__ imports its DataProto,
#     which imports ray and tensordict, so they cannot be left out even though the functions under
#     test are plain torch.
#     The LOCK is `pip freeze` of that list resolved with torch held at 2.13.0 (a constraints
#     file), plus verl and pip.
# pip warns that verl wants more (wandb, torchdata, ...); that is expected (--no-deps).
# Size: about 1.4 GB (torch 0.75 GB, ray 0.2 GB); from nothing about a minute.
# Idempotent: a stamp file in the venv records the inputs (the LOCK's checksum and the interpreter's
# version); a second run with the same inputs only checks the venv's interpreter and prints the
# versions. A venv this script made is rebuilt from scratch when the inputs change.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-verl}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.verl-reference-installed"

if [[ "$(cd "$(dirname "$VENV")" 2>/dev/null && pwd)/$(basename "$VENV")" == "$ROOT/.venv" ]]; then
    echo "setup_verl_env: refusing to install verl into the project's own .venv" >&2
    exit 2
fi

read -r -d '' LOCK <<'EOF' || true
pip==26.3
verl==0.9.1
torch==2.13.0
annotated-doc==0.0.7
annotated-types==0.8.0
anyio==4.16.0
attrs==26.1.0
certifi==2026.10.18
charset-normalizer==3.5.2
click==8.5.1
cloudpickle==3.1.2
codetiming==1.4.0
filelock==4.2.12
fsspec==2026.9.0
h11==0.16.0
hf-xet==1.8.0
httpcore==1.0.9
httpx==0.28.1
huggingface_hub==1.33.0
idna==3.20
importlib_metadata==10.2.0
Jinja2==3.1.6
jsonschema==4.26.0
jsonschema-specifications==2025.9.1
lazy-importer==0.1.0
markdown-it-py==4.3.0
MarkupSafe==3.0.4
mdurl==0.1.2
mpmath==1.3.0
msgpack==1.2.4
networkx==3.6.1
numpy==2.4.6
omegaconf==2.4.0
orjson==3.13.0
packaging==25.0
protobuf==7.36.2
pydantic==2.14.3
pydantic_core==2.50.4
Pygments==2.21.0
pyvers==0.1.0
PyYAML==6.0.3
ray==2.60.0
referencing==0.37.0
regex==2026.11.15
requests==2.34.2
rich==15.0.0
rpds-py==2026.9.1
safetensors==0.8.0
shellingham==1.5.4
sympy==1.14.0
tensordict==0.10.0
tokenizers==0.22.2
tqdm==4.70.1
transformers==5.10.4
typer==0.29.2
typing-inspection==0.4.5
typing_extensions==4.16.0
urllib3==2.8.0
zipp==4.1.2
EOF

interpreter="$("$PYTHON" -c 'import sys; print(sys.version.split()[0])')"
WANT="lock=$(printf '%s\n' "$LOCK" | cksum | cut -d' ' -f1) python=$interpreter"

report() {
    "$VENV/bin/python" - <<'PY'
from importlib.metadata import version

names = ["verl", "torch", "tensordict", "transformers", "ray"]
print("  ".join(f"{name} {version(name)}" for name in names))
PY
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" && -x "$VENV/bin/python" ]]; then
    echo "verl reference env up to date: $VENV"
    report
    exit 0
fi

start=$SECONDS
if [[ -f "$STAMP" ]]; then # ours, from other inputs: start again so nothing old lingers
    rm -rf "$VENV"
fi
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
echo "*" >"$VENV/.gitignore" # git ignores the whole venv (as Python 3.13's venv does on its own)
lock="$(mktemp)"
trap 'rm -f "$lock"' EXIT
printf '%s\n' "$LOCK" >"$lock"
"$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$lock"
"$VENV/bin/python" -c "import verl.trainer.ppo.core_algos, verl.trainer.ppo.rollout_corr_helper"

echo "$WANT" >"$STAMP"
echo "verl reference env ready in $((SECONDS - start)) s: $VENV"
report
