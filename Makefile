# raftcron: `make demo` runs a local 3-node cluster, `make test` runs everything CI checks.
# Only python3 and make are needed: the first target creates .venv and installs the project.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: test lint typecheck docs unit integration upgrade container demo bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy -p raftcron

# The tiers (tests/conftest.py): `unit` starts no process (a test that does fails, naming the
# tier), `integration` runs the ones that start nodes, workers, a browser or the chaos smoke,
# the rolling upgrade included. Both use the machine's cores; integration keeps each module on
# one worker (--dist loadfile) so a module's shared cluster is started once. Integration runs
# three modules at a time even on two cores: its tests spend part of their time waiting on
# elections, leases and browsers (measured on a 2-core machine: 10:39 with two, 8:57 with
# three, the cores 88% busy).
unit: $(STAMP)
	$(BIN)/pytest -n auto -m "not processes" --durations=20

integration: $(STAMP)
	$(BIN)/pytest -n 3 --dist loadfile -m processes --durations=20

# The rolling upgrade from the previous release (tests/cluster/test_rolling_upgrade.py) alone,
# with its figures: builds that release's wheel from its git commit (in the clone's history;
# pip fetches the build backend from PyPI) into a venv of its own; about 10-30 s. make
# integration (so make test, so CI) runs it too.
upgrade: $(STAMP)
	$(BIN)/pytest -m upgrade -rP

# The container image (tests/container) alone, with its figures: builds the Dockerfile with
# podman (root; podman, runc and debootstrap from apt, as .ci/run installs them) and runs
# compose.yaml's services from it. The first run makes the base image and downloads the
# dependencies (2.5-5 min here); later ones build from podman's layer cache (about 40 s in all).
# make integration (so make test, so CI) runs it too.
container: $(STAMP)
	$(BIN)/pytest tests/container --durations=5

# The documentation site (mkdocs.yml): the reference pages written from the code
# (cluster/dev/docsgen.py: the CLI, the config keys, the HTTP API, the metrics), then the site
# built into build/site, strictly: a broken link or anchor, or a page outside the nav, fails.
# Under `make test` the pages are only compared (--check: a page that differs from the code
# fails, "run make docs"), so a commit that forgot them does not pass because CI rewrote them.
docs: $(STAMP)
	$(BIN)/python -m raftcron.cluster.dev.docsgen $(DOCSGEN_FLAGS)
	$(BIN)/mkdocs build --strict --quiet

test: DOCSGEN_FLAGS = --check
test: lint typecheck docs unit integration

demo: $(STAMP)
	$(BIN)/raftcron demo

# The core alone (cluster/dev/corebench.py: it needs a clock, which scheduler/ must not have),
# then a local cluster against the baselines.
bench: $(STAMP)
	$(BIN)/python -m raftcron.cluster.dev.corebench
	$(BIN)/raftcron bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build/site
