# rota: `make up` runs rota, `make test` runs the whole test suite, `make bench` every benchmark.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: up demo test test-fast test-slow lint bench bench-vs-slurm parity-vs-slurm install clean browser web-shots

$(STAMP): pyproject.toml cli/native/rota_command.c agents/native/rota_exec.c
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "rota needs Python 3.11 or newer")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# the native client's links go first: pip writes its own entry points there
	if [ -d $(VENV)/bin ]; then find $(VENV)/bin -maxdepth 1 -type l -lname rota-command -delete; fi
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test,plot]"
	@# the native thin client, where there is a C compiler, as sbatch, squeue, ... (otherwise pip's Python
	@# entry points stay: the same thin path, with Python's start in front), and rota-exec, which the
	@# agents start jobs through (otherwise they fork)
	$(VENV)/bin/rota install-commands || true
	@# byte code, as pip writes for an installed package: the commands then start without compiling
	@# rota's modules (an editable install has none, and PYTHONDONTWRITEBYTECODE stops Python writing it)
	$(PY) -m compileall -q core agents cli controller projections wire bench client programs web > /dev/null
	touch $(STAMP)

install: $(STAMP)

# rota up: embedded nats-server + controller + a local agent, in the foreground until Ctrl-C.
# Without an NVIDIA driver the local node gets 4 fake A100s (a fake NVML), so GPU jobs can be tried.
FAKE_GPUS ?= $(if $(shell command -v nvidia-smi 2>/dev/null),,a100:4)
up: $(STAMP)
	$(VENV)/bin/rota up $(if $(FAKE_GPUS),--fake-gpus $(FAKE_GPUS))

demo: $(STAMP)
	$(VENV)/bin/rota demo

test: $(STAMP) browser
	$(PY) -m pytest -q

# Debian's chromium for the web view's browser tests (driven by Playwright), where apt-get can install it
browser:
	@command -v chromium > /dev/null || ! command -v apt-get > /dev/null || [ "$$(id -u)" != 0 ] || \
		{ DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium > /dev/null 2>&1 || \
		  { apt-get update -q > /dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium > /dev/null; }; }

# the web view's screenshots in docs/web, from the browser tests
web-shots: $(STAMP) browser
	ROTA_WEB_SHOTS=docs/web $(PY) -m pytest -q tests/test_web.py -k browser

# the loop of seconds: the core and the front door on the in-memory log, nothing started (under 30 s)
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "fast and not slow"

# a real Slurm on this host (ops/slurm/setup.sh, as root) and rota, the same workloads in one run, alternating
bench-vs-slurm: $(STAMP)
	ops/slurm/setup.sh
	$(PY) -m rota.bench.thin_bench --slurm

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# ruff, and mypy over the folders as the package they install as (rota.<folder>, linked under build/)
lint: $(STAMP)
	$(VENV)/bin/ruff check $$(git ls-files '*.py' 2>/dev/null || find . -name '*.py' -not -path './.venv/*')
	mkdir -p build/typecheck/rota && touch build/typecheck/rota/__init__.py
	for d in core agents cli controller projections wire bench client programs web; do ln -sfn ../../../$$d build/typecheck/rota/$$d; done
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) -m rota.bench.run_all

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis

# the parity scenarios (tests/fixtures/parity) on a real Slurm with accounting and on rota at once: a table of
# the decisions, reasons and sprio factors that differ; RECORD=1 keeps Slurm's as the tests' fixtures
parity-vs-slurm: $(STAMP)
	WITH_DBD=1 ops/slurm/setup.sh
	$(PY) -m rota.bench.parity $(if $(RECORD),--record)
