# Two set-up commands: `make demo` runs the console, `make test` runs the suite.
# Needs only python3 (3.11+) and make; uv is bootstrapped into .tools/ and installs from uv.lock.
SHELL := /bin/bash
PYTHON ?= python3
UV_VERSION := 0.13.9
UV := .tools/bin/uv
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000
# Production-mode integration run (CI): its own database and Redis db index.
IT_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/gpuconsole_it
IT_REDIS_URL ?= redis://127.0.0.1:6379/11

.PHONY: demo test test-integration lint format messages bench system-deps serve prod clean recipe-env jupyter-env

$(UV):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required")'
	$(PYTHON) -m venv .tools
	.tools/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

$(VENV)/.synced: $(UV) uv.lock pyproject.toml
	UV_PYTHON=$(PYTHON) $(UV) sync --frozen --quiet
	@touch $@

demo: $(VENV)/.synced
	$(PY) manage.py migrate --noinput -v 0
	$(PY) manage.py demo_setup
	@echo
	@echo "  GPU Console (embedded demo, simulated fleet) on http://$(HOST):$(PORT)/"
	@echo "  Log in as  demo / demo-password-2026  (operator: ops / ops-password-2026)"
	@echo "  Data, mail (var/mail/) and this install's secret key live in var/"
	@echo
	$(VENV)/bin/uvicorn console.asgi:application --host $(HOST) --port $(PORT) --lifespan off --ws-per-message-deflate false --ws-max-size 262144

serve: $(VENV)/.synced
	$(VENV)/bin/uvicorn console.asgi:application --host $(HOST) --port $(PORT) --lifespan off --ws-per-message-deflate false --ws-max-size 262144

# Browser journeys need Debian's Chromium; the SSH tests need openssh-server; invoice PDFs embed
# the Chinese font of fonts-wqy-microhei (INVOICE_FONT_PATH, billing/invoicing/pdf.py). The
# real-Slurm tests (tests/slices/test_slurm_ssh.py) run Debian's Slurm 22.05 and munge on the
# sshd test hosts (about 15 MB; the packages' own services are never started). `make prod` serves
# through Debian's nginx (console/edge.py; its packaged service is never started either), which
# the edge's tests and benches run too; openssh-client's ssh carries the edge's web ports.
CJK_FONT := /usr/share/fonts/truetype/wqy/wqy-microhei.ttc
DEBIAN_DEPS := chromium openssh-server openssh-client fonts-wqy-microhei slurmctld slurmd slurmrestd slurm-client munge iproute2 nginx
system-deps:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/sbin/sshd ] || [ ! -f $(CJK_FONT) ] \
	    || [ ! -x /usr/sbin/nginx ] || [ ! -x /usr/bin/ssh ] \
	    || [ ! -x /usr/sbin/slurmctld ] || [ ! -x /usr/sbin/slurmd ] || [ ! -x /usr/sbin/slurmrestd ] \
	    || [ ! -x /usr/bin/sbatch ] || [ ! -x /usr/sbin/munged ] || [ ! -x /usr/sbin/ip ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEBIAN_DEPS) >/dev/null \
	      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEBIAN_DEPS) >/dev/null; }; \
	  else echo "Please install Debian packages: $(DEBIAN_DEPS)"; exit 1; fi; \
	fi

# The LLaMA LoRA recipe's own environment (torch CPU, transformers, peft): what the image ships,
# never the console's. Built once from the recipe's requirements.txt (about 2.5 min, ~1.2 GB) and
# kept until they change; tests/slices/test_recipe_runs.py runs the recipe with it on an sshd host.
# The AI applications' servers (marketplace/apps/) run in it too, with their extras (diffusers).
RECIPE_VENV := var/recipe-venv
RECIPE_REQS := marketplace/recipes/llama-lora/requirements.txt
APPS_REQS := marketplace/apps/requirements.txt

$(RECIPE_VENV)/.requirements: $(RECIPE_REQS) $(APPS_REQS)
	$(PYTHON) -m venv $(RECIPE_VENV)
	$(RECIPE_VENV)/bin/pip install --quiet --disable-pip-version-check -r $(RECIPE_REQS) -r $(APPS_REQS)
	cat $(RECIPE_REQS) $(APPS_REQS) > $@

recipe-env: $(RECIPE_VENV)/.requirements

# The console layer's JupyterLab (what every image ships), for tests/e2e/test_jupyterlab.py: the
# image's launch command runs it on an sshd test host and the console's proxy opens it. Built once
# from the pinned requirements (about 1 min, ~250 MB) and kept until they change.
JUPYTER_VENV := var/jupyter-venv
JUPYTER_REQS := marketplace/data/jupyterlab-requirements.txt

$(JUPYTER_VENV)/.requirements: $(JUPYTER_REQS)
	$(PYTHON) -m venv $(JUPYTER_VENV)
	$(JUPYTER_VENV)/bin/pip install --quiet --disable-pip-version-check -r $(JUPYTER_REQS)
	cp $(JUPYTER_REQS) $@

jupyter-env: $(JUPYTER_VENV)/.requirements

# The suite on TEST_WORKERS pytest-xdist workers (README "Tests and CI"): a test module runs on one
# worker, the modules on the SSH test hosts one after another (tests/conftest.py HOST_MODULES);
# TEST_WORKERS=0 runs it in this one process. It prints its 20 slowest steps and its wall time.
TEST_WORKERS ?= 3
test: $(VENV)/.synced system-deps recipe-env jupyter-env
	@started=$$(date +%s); rc=0; \
	  $(VENV)/bin/pytest -m "not integration" -q -n $(TEST_WORKERS) --dist loadfile --durations=20 || rc=$$?; \
	  echo "make test: $$(( $$(date +%s) - started )) s wall time (TEST_WORKERS=$(TEST_WORKERS))"; exit $$rc

test-integration: $(VENV)/.synced system-deps
	DATABASE_URL=$(IT_DATABASE_URL) REDIS_URL=$(IT_REDIS_URL) APPS_DOMAIN=$${APPS_DOMAIN:-localhost} SECRET_KEY=$${SECRET_KEY:-integration-$$(head -c 48 /dev/urandom | base64 | tr -d '/+=')} \
	  SECURE_SSL_REDIRECT=false SESSION_COOKIE_SECURE=false CSRF_COOKIE_SECURE=false \
	  $(VENV)/bin/pytest -m integration -q

# Type-checked with mypy + django-stubs (pyproject.toml [tool.mypy]): the services, the dashboard,
# billing's views, tasks, API and ledger modules. The pure modules are checked apart with --strict;
# their one list is the import-linter contract "Pure modules import no Django" (.ci/pure-modules).
TYPED := console/services.py console/edge.py console/dashboard.py slices/services/ slices/models/ marketplace/services.py billing/services.py \
	billing/ledger.py billing/settlement.py billing/sql.py billing/errors.py billing/statements.py \
	billing/views.py billing/tasks.py billing/api/ billing/providers/ billing/offers.py console/errors.py console/api/exceptions.py \
	console/ids.py console/loading.py console/retries.py console/verification/ billing/invoicing/ billing/bills/ \
	billing/transfers/ console/notices/ console/audit/

# lint-imports checks the boundaries written in pyproject.toml [tool.importlinter].
lint: $(VENV)/.synced
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/mypy $(TYPED)
	$(VENV)/bin/mypy --strict $$($(PY) .ci/pure-modules)

format: $(VENV)/.synced
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# make messages APP=billing : collect strings of <app>/ and templates/<app>/ into <app>/locale, compile.
messages: $(VENV)/.synced
	@test -n "$(APP)" || (echo "usage: make messages APP=<console|slices|marketplace|billing>"; exit 2)
	mkdir -p $(APP)/locale
	cd $(APP) && ln -sfn ../templates/$(APP) _templates && \
	  (if [ "$(APP)" = console ]; then ln -sfn ../templates _alltemplates; fi) && \
	  ../$(PY) ../manage.py makemessages -l zh_Hans --symlinks -e html,py,txt --no-obsolete \
	    -i 'migrations/*' -i '_alltemplates/slices/*' -i '_alltemplates/marketplace/*' -i '_alltemplates/billing/*' ; \
	  rc=$$?; rm -f _templates _alltemplates; exit $$rc
	cd $(APP) && ../$(PY) ../manage.py compilemessages -l zh_Hans

# bench/load.py runs the production stack (PostgreSQL at DATABASE_URL or 127.0.0.1:5432, redis-server)
# under load for 5 minutes plus 1-2 minutes of set-up; `bench/load.py --quick` is a 30 s smoke run.
bench: $(VENV)/.synced
	@failed=""; for b in bench/*.py; do echo "== $$b"; $(PY) $$b || failed="$$failed $$b"; done; \
	  if [ -n "$$failed" ]; then echo "missed a target or failed:$$failed"; exit 1; fi

# Production mode (README "Production mode"): nginx on EDGE_LISTEN (0.0.0.0:8000) in front of
# the web processes on HOST:WEB_PORT (127.0.0.1:8001), both from the Procfile. WEB_PORT is set
# here since honcho gives each process a PORT of its own.
prod: $(VENV)/.synced
	@test -x /usr/sbin/nginx || { echo "make prod serves through nginx: run make system-deps (apt-get install nginx)"; exit 1; }
	$(VENV)/bin/python manage.py collectstatic --noinput -v 0
	WEB_PORT=$${WEB_PORT:-8001} $(VENV)/bin/honcho start

clean:
	rm -rf var .pytest_cache .ruff_cache
