# Two commands for everyone: `make demo` and `make test`. Both bootstrap .venv idempotently.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# pytest workers: one per core, at most 4 (the suite waits on daemons and sockets as much as
# it computes; beyond 4 the per-worker start-up costs more than it saves).
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)
# Debian packages the integration tests drive for real (Slurm, munge, rsyslog, iproute2's rdma,
# Chromium for the HTML report, nats-server for the cluster tier).
SYSTEM_PACKAGES := slurmctld slurmd slurm-client munge rsyslog rsyslog-gnutls iproute2 procps \
                   chromium nats-server

.PHONY: demo test lint typecheck bench system-deps clean

# A bare Debian image lacks python3-venv: as root, install it and try once more.
$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); [ "$$(id -u)" = 0 ] && \
	  (apt-get install -y --no-install-recommends python3-venv >/dev/null 2>&1 || \
	   (apt-get update >/dev/null && apt-get install -y --no-install-recommends python3-venv >/dev/null)) && \
	  $(PYTHON) -m venv $(VENV); }
	$(BIN)/pip install --quiet --upgrade pip

# Re-install only when the project metadata changed. An installed wheel carries .pyc files; the
# editable install does not, and with PYTHONDONTWRITEBYTECODE set every run would compile the
# modules it imports again: compileall writes them whatever that variable says, so the tree
# starts as fast as what users get (Python reads an existing .pyc even when it may not write).
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	$(BIN)/python -m compileall -q detector sensors rules fixtures/demo >/dev/null
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

# apt-get only as root and only for what is missing; an unprivileged developer gets a
# message and the tests that need the package skip with the reason.
system-deps:
	@missing=""; for p in $(SYSTEM_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing:$$missing"; \
	    (apt-get install -y --no-install-recommends $$missing >/dev/null 2>&1 || \
	     (apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing >/dev/null)) \
	      || echo "warning: could not install$$missing; tests that need them will skip"; \
	  else echo "note: missing system packages:$$missing (run as root to install)"; fi; \
	fi

# The demo snapshot holds attacks of every vector: `scan` exits 1 when it alerts, which is
# the demo's success; no alert (0) or an error (2) fails it.
demo: $(VENV)/.installed
	@rc=0; $(BIN)/hpcsec scan --demo || rc=$$?; \
	if [ $$rc -eq 1 ]; then exit 0; else echo "demo raised no alerts (exit $$rc)" >&2; exit 1; fi

test: $(VENV)/.installed-test system-deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(MAKE) --no-print-directory typecheck
	$(BIN)/hpcsec rules check --strict
	$(BIN)/hpcsec rules test
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy reads the tree under its installed names (hpcsec.detector, hpcsec.sensors); the
# editable install hides them from it, so a link farm in .typecheck/ gives it that view.
typecheck: $(VENV)/.installed-test
	@mkdir -p .typecheck/hpcsec && for d in detector sensors rules; do \
	  ln -sfn ../../$$d .typecheck/hpcsec/$$d; done
	MYPYPATH=.typecheck $(BIN)/mypy -p hpcsec.detector -p hpcsec.sensors

bench: $(VENV)/.installed
	$(BIN)/python -m compileall -q detector sensors rules fixtures/demo >/dev/null
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache .typecheck
