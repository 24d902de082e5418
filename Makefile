# Gantry: `make run` starts the embedded platform, `make test` runs the whole suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test
TEST_REDIS_URL ?= redis://127.0.0.1:6379/0
# The migration linter reads SQL as PostgreSQL's backend writes it: any database of the server.
LINT_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres
PYTEST_ARGS ?=

.PHONY: run test check venv lock services browser control-plane control-plane-peers lint fmt bench clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $@

## lock: write constraints.txt, the pinned versions every install uses, from the current .venv
## (after a dependency is added to pyproject.toml and installed: `.venv/bin/pip install -e '.[dev]'`).
lock:
	{ sed -n '1,2p' constraints.txt; $(PY) -m pip freeze --exclude-editable | grep -v '^-e\|@ file'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

## run: migrate, seed the demo organisation, start a Celery worker, the scheduler daemon
## (simulated cluster of the demo inventory, demo load on) and the web server.
run: venv
	$(PY) manage.py migrate --noinput
	$(PY) manage.py seed_demo --host $(HOST) --port $(PORT)
	@echo "Gantry on http://$(HOST):$(PORT)/  (API docs: http://$(HOST):$(PORT)/api/v1/docs/)"
	$(PY) manage.py run_embedded --host $(HOST) --port $(PORT)

## services: PostgreSQL and Redis for the test suite: installed from Debian's packages when missing
## (as root), local password-less access for the `postgres` user on 127.0.0.1, started when down.
services:
	@command -v pg_ctlcluster >/dev/null && command -v redis-server >/dev/null || { \
	  test "$$(id -u)" = 0 || { echo "PostgreSQL or Redis is missing: run 'sudo apt-get install postgresql redis-server'"; exit 1; }; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql redis-server >/dev/null; }
	@test -n "$$(ls /etc/postgresql 2>/dev/null)" || pg_createcluster --start 15 main >/dev/null
	@hba=/etc/postgresql/$$(ls /etc/postgresql | head -1)/main/pg_hba.conf; \
	  if test -w "$$hba" && ! grep -q '^host all postgres 127.0.0.1/32 trust' "$$hba"; then \
	    sed -i '1i host all postgres 127.0.0.1/32 trust' "$$hba"; \
	    pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql | head -1) main reload 2>/dev/null || true; fi
	@pg_isready -q -h 127.0.0.1 -p 5432 || pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql | head -1) main start
	@for i in $$(seq 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
	@redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 || redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
	@for i in $$(seq 30); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break; sleep 1; done

## browser: Debian's chromium for the Playwright tests (never `playwright install`).
browser:
	@test -x /usr/bin/chromium || { test "$$(id -u)" = 0 && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  { echo "chromium is missing: run 'sudo apt-get install chromium'"; exit 1; }

## control-plane: build the real Kubernetes control plane's binaries (devcluster), or find them
## cached (GANTRY_CONTROL_PLANE_CACHE, default ~/.cache/gantry/control-plane): docs/kubernetes.md.
control-plane: venv
	$(PY) -m devcluster build

## control-plane-peers: also build the peers run beside Gantry (Kueue, for bench/k8s_kueue.py;
## JobSet's and LeaderWorkerSet's controllers, devcluster/controllers.py): opt-in, their cold
## builds take about 15, 7 and 6 minutes on two cores.
control-plane-peers: venv
	$(PY) -m devcluster build --peers

## check: lint, format, types, layers, Django checks, migrations up to date, and linted as
## PostgreSQL runs them (no change that breaks the previous release: docs/upgrading.md).
check: venv services
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) manage.py check
	$(PY) manage.py makemigrations --check --dry-run
	DATABASE_URL=$(LINT_DATABASE_URL) $(PY) manage.py lint_migrations

## test: the whole suite on PostgreSQL and Redis, then again on the embedded default (SQLite,
## the in-process cache) that `make run` uses, after the checks. The real-cluster tests must run
## (GANTRY_K8S_REAL=required); the second pass repeats only those that touch the database.
test: venv services browser control-plane
	$(MAKE) --no-print-directory check
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) GANTRY_K8S_REAL=required \
	  $(PY) -m pytest -n 2 --durations=15 $(PYTEST_ARGS)
	env -u DATABASE_URL -u REDIS_URL GANTRY_K8S_REAL=db-only \
	  $(PY) -m pytest -n 2 --durations=5 $(PYTEST_ARGS)

fmt: venv
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf var staticfiles .pytest_cache .mypy_cache .ruff_cache
