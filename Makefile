# Setup contract: on a fresh clone `make run` and `make test` set up everything they need.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
SCENARIO ?= scenarios/a10g_10gbps.yaml

.PHONY: run test lint docs readme-example format mutate mutate-sample clean compiled

$(VENV)/.core-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --config-settings editable_mode=compat -e .
	touch $@

$(VENV)/.test-installed: $(VENV)/.core-installed
	$(PY) -m pip install -q --config-settings editable_mode=compat -e '.[test]'
	bash scripts/install_test_system_deps.sh
	touch $@

run: $(VENV)/.core-installed $(VENV)/.compiled
	$(PY) cli.py simulate $(SCENARIO) --out out/default

# The simulator's event-loop modules compiled by mypyc from their own source into build/mypyc/ (scripts/
# build_compiled.py; simulator/compiled.py loads them while they match the sources): the same outputs, byte for byte,
# in about half the CPU time. Optional: where mypy cannot be installed or there is no C compiler, the build is
# skipped and the simulator runs as Python. The stamp is remade when a simulator source changes.
MYPY_VERSION := 2.4.1
compiled: $(VENV)/.compiled
$(VENV)/.compiled: $(VENV)/.mypy-installed $(wildcard simulator/*.py) scripts/build_compiled.py
	$(PY) -m scripts.build_compiled
	touch $@

# mypy (and mypy_extensions, which simulator/timers.py and columns.py import where it is there) before the build and
# before pyright, so lint sees the same packages on a fresh clone as after a build
$(VENV)/.mypy-installed: $(VENV)/.core-installed
	-$(PY) -m pip install -q 'mypy==$(MYPY_VERSION)'
	touch $@

# Two pytest-xdist workers (CI has two cores), each test file on one worker (module fixtures built once).
# Chromium and kaleido are installed here, so a browser test fails rather than skips without them
# (tests/reports/browser_required.py); hypothesis draws its derandomised "ci" profile (tests/conftest.py). The compiled
# modules are built first, and tests/test_compiled.py fails rather than skips without them.
TEST_WORKERS ?= 2
test: export HACKSIM_REQUIRE_BROWSER = 1
test: export HACKSIM_REQUIRE_COMPILED = 1
test: lint docs $(VENV)/.compiled
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

# ruff (lint and format check) over the tree, then pyright (basic mode, [tool.pyright] in pyproject.toml) with the
# venv's packages; part of `make test`, so CI runs it. pyright runs on the Node.js wheel its nodejs extra installs.
lint: $(VENV)/.test-installed $(VENV)/.mypy-installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pyright --pythonpath $(PY)

# The manual (docs/, mkdocs.yml) built into site/ with --strict: a broken link or anchor, or a page missing from the
# nav, fails it; part of `make test`. docs/hooks.py generates the command and schema reference pages from the code
# during the build, so they are never stale (and never committed). NO_MKDOCS_2_WARNING silences Material's banner
# about MkDocs 2.0. Not --quiet: mkdocs 1.6 then drops the warnings before --strict counts them, and a broken link
# passes.
docs: $(VENV)/.test-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The README's worked example (also the manual's home page) rewritten from a fresh run of the default scenario: the
# table `make run` prints and every figure of the text under it; and its two short examples (one engine on one GPU,
# a DP x EP MoE model) from fresh runs of theirs (scripts/readme_example.py). Run it after a change that moves
# them; tests/test_readme_example.py fails until then.
readme-example: $(VENV)/.core-installed
	$(PY) -m scripts.readme_example

format: $(VENV)/.test-installed
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

# Mutation testing of costmodel/ and simulator/ ([tool.mutmut] in pyproject.toml; docs/testing.md).
# MUTATE picks functions by name glob, e.g. MUTATE='costmodel.methods* simulator.link*'; all by default (hours).
MUTATE ?=
mutate: $(VENV)/.test-installed
	rm -rf mutants
	nice -n 15 $(VENV)/bin/mutmut run $(MUTATE)
	$(VENV)/bin/mutmut results

# Sampled mutation testing, a kill ratio per area in about an hour (scripts/mutation_sample.py: mutmut's mutants, a
# fixed-seed sample of PER_AREA per area, each run against its area's tests; docs/testing.md has the last figures).
PER_AREA ?= 20
SEED ?= 0
mutate-sample: $(VENV)/.test-installed
	nice -n 19 $(PY) -m scripts.mutation_sample --per-area $(PER_AREA) --seed $(SEED) --json out/mutants.json

clean:
	rm -rf $(VENV) out mutants site build/mypyc
