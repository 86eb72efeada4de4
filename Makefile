# Setup contract: on a fresh clone `make run` and `make test` set up everything they need.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
SCENARIO ?= scenarios/a10g_10gbps.yaml

.PHONY: run test bench clean

$(VENV)/.core-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --config-settings editable_mode=compat -e .
	touch $@

$(VENV)/.test-installed: $(VENV)/.core-installed
	$(PY) -m pip install -q --config-settings editable_mode=compat -e '.[test]'
	bash scripts/install_test_system_deps.sh
	touch $@

run: $(VENV)/.core-installed
	$(PY) cli.py simulate $(SCENARIO) --out out/default

test: $(VENV)/.test-installed
	$(PY) -m pytest

clean:
	rm -rf $(VENV) out
