# compactd — everything a fresh machine with Python 3.11+ (and Node 20 for the Node client) needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
RUN_DATA := .run/data

.PHONY: install run test lint bench clean node-test agents browser

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,plot,postgres,docs]'
	touch $(STAMP)

install: $(STAMP)

## make run — import a bundled real Claude Code transcript through the daemon and show its context panel,
## then the cascade as a preview (it writes nothing); into a fresh data dir each time, so what it shows
## is this version's import, never a session an older one left
run: $(STAMP)
	@rm -rf $(RUN_DATA) && mkdir -p $(RUN_DATA)
	COMPACTD_DATA_DIR=$(RUN_DATA) COMPACTD_SUMMARY_PROVIDER=digest $(BIN)/compactd demo tests/data/transcripts/claude-code/64da7265-8f07-4967-b79f-0ae374c13330.jsonl

## the real agent CLIs the proxy's tests drive, pinned in tests/agents: the npm ones (Claude Code,
## Codex, Gemini CLI, opencode, Qwen Code) from the lock as it stands — `npm install --no-save`, not
## `npm ci`: the registry reached here serves only the Linux builds of opencode's and its
## clipboard's platform packages, so the lock lists only those, and `npm ci` refuses a lock without
## every platform's optional package
AGENTS := tests/agents/node_modules/.package-lock.json
$(AGENTS): tests/agents/package.json tests/agents/package-lock.json
	cd tests/agents && npm install --no-save --no-audit --no-fund --loglevel=error
	touch $@

## aider (PyPI `aider-chat`, which pins a hundred packages of its own) in a virtualenv of its own
AIDER_VENV := tests/agents/aider-venv
AIDER := $(AIDER_VENV)/.installed
$(AIDER): tests/agents/aider-requirements.txt
	$(PYTHON) -m venv $(AIDER_VENV)
	$(AIDER_VENV)/bin/python -m pip install -q --upgrade pip
	$(AIDER_VENV)/bin/python -m pip install -q -r tests/agents/aider-requirements.txt
	touch $@

agents: $(AGENTS) $(AIDER)

## headless Chromium from the OS packages, for the page's test in a real browser: installed with
## apt-get where it is absent and apt-get can (as root); otherwise said, and that test fails
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	{ command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	echo "make: chromium is missing and apt-get cannot install it here: the page's browser test will fail"

## make test — lint, the docs site (a broken link fails), every Python test, the daemon's end-to-end tests once more on PostgreSQL
## (a throwaway cluster; files-only tests skip), and the Node client's tests
test: $(STAMP) $(AGENTS) $(AIDER) browser
	@# byte code written once: the suite starts hundreds of Python processes (daemons, the CLI,
	@# fakes), and where PYTHONDONTWRITEBYTECODE is set each would compile compactd again
	$(BIN)/python -m compileall -q -j0 -x 'node_modules|aider-venv' compactd context protocol service daemon proxy clients tests
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mkdocs build --strict --site-dir .site
	$(BIN)/python -m pytest -q --durations=15
	COMPACTD_TEST_STORE=postgres $(BIN)/python -m pytest -q tests/daemon
	@if [ -d clients/node ]; then $(MAKE) --no-print-directory node-test; fi

## the extension's node_modules first: the Node tests package it with its own vsce
node-test: $(STAMP)
	@if [ -d clients/vscode ]; then cd clients/vscode && npm ci --no-audit --no-fund --loglevel=error && npm run build; fi
	cd clients/node && npm ci --no-audit --no-fund --loglevel=error && npm test

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

## make bench — the performance ratios (name: value lines)
bench: $(STAMP)
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) .run .pytest_cache .hypothesis
