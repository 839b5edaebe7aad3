# Two commands for a newcomer: `make demo` and `make test`.
# Each sets up what it needs: a virtualenv in .venv with the package and its
# extras, and the Debian packages it uses when they are missing -- prometheus
# and nginx-light for both, chromium too for the test suite's browser tests --
# installed when we are root, otherwise the exact apt-get line is printed and
# make exits 2.

PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST := $(BIN)/python -m pytest -q -p no:cacheprovider
# `make demo` needs no browser; the test suite drives a real headless Chromium.
BROWSER ?= 0

.PHONY: demo test setup debs venv lint bench props-deep clean

setup: debs venv

debs:
	@missing=""; \
	command -v prometheus >/dev/null 2>&1 || [ -x /usr/bin/prometheus ] || missing="$$missing prometheus"; \
	command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing="$$missing nginx-light"; \
	if [ "$(BROWSER)" = "1" ]; then command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; fi; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = "0" ]; then \
	    echo "migscale: installing Debian packages:$$missing"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null || exit 1; \
	  else \
	    echo "migscale: missing Debian packages:$$missing"; \
	    echo "run:  sudo apt-get install -y$$missing"; \
	    exit 2; \
	  fi; \
	fi

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/pip install -q -e '.[dev,multinode]'
	@touch $(STAMP)

demo: setup
	$(BIN)/migscale demo examples/models.yaml examples/cluster.yaml --results demo-results

# Three passes: tests that start no real server run on every core (pytest-xdist);
# those that start tritonserver, nginx or Prometheus and only wait for what they
# check run two at a time; those whose verdict is a measured latency, rate or
# interval (marked alone) and the Chromium tests run one at a time, so those
# verdicts are not measured on a machine busy with the rest. All three always
# run; make fails if any did.
test:
	@$(MAKE) --no-print-directory setup BROWSER=1
	@rc=0; \
	$(PYTEST) -n auto -m "not integration and not browser" tests || rc=$$?; \
	$(PYTEST) -n 2 -m "integration and not alone and not browser" tests || rc=$$?; \
	$(PYTEST) -m "alone or browser" tests || rc=$$?; \
	exit $$rc

# The planner's and decide's property tests at depth, outside `make test`: each planner fault
# they have found needed 5,000-10,000 examples a test (about 10 minutes a seed on one core).
PROPS_EXAMPLES ?= 10000
PROPS_SEEDS ?= 1 2 3
props-deep: venv
	@rc=0; for s in $(PROPS_SEEDS); do \
	  echo "planner and decide property tests: seed $$s, $(PROPS_EXAMPLES) examples"; \
	  PLANNER_EXAMPLES=$(PROPS_EXAMPLES) $(PYTEST) -p no:timeout tests/unit/test_planner_props.py \
	    tests/unit/test_decide_props.py --hypothesis-seed=$$s || rc=$$?; \
	done; exit $$rc

lint: venv
	$(BIN)/ruff check autoscaler tests loadtests benchmarks
	$(BIN)/lint-imports

bench: setup
	$(BIN)/python benchmarks/planner.py
	$(BIN)/python benchmarks/metrics_api.py
	$(BIN)/python benchmarks/policies.py

clean:
	rm -rf $(VENV) run demo-results test-artifacts
