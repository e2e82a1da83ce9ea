# raftcron: `make demo` runs a local 3-node cluster, `make test` runs everything CI checks.
# Only python3 and make are needed: the first target creates .venv and installs the project.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: test lint typecheck unit demo bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy -p raftcron

unit: $(STAMP)
	$(BIN)/pytest --durations=40

test: lint typecheck unit

demo: $(STAMP)
	$(BIN)/raftcron demo

# The core alone (cluster/corebench.py: it needs a clock, which scheduler/ must not have),
# then a local cluster against the baselines.
bench: $(STAMP)
	$(BIN)/python -m raftcron.cluster.corebench
	$(BIN)/raftcron bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
