# Quick start: `make demo` (a trainer and rollout processes sync ~1 GiB of weights through refhub,
# then a short benchmark against the bare limits) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := ./scripts/pip-quiet.sh $(PY) -m pip
STAMP  := $(VENV)/.tent-installed
PLUGINS := tcp shm gds nvlink ascend rdma
PLUGIN_DIRS := $(foreach p,$(PLUGINS),$(wildcard plugins/$(p)))
SOURCES := pyproject.toml setup.py $(wildcard tent_core/_native/*.c tent_core/include/tent/*.h) \
           $(wildcard plugins/*/pyproject.toml plugins/*/setup.py plugins/*/csrc/*.c plugins/*/csrc/*.h refhub/pyproject.toml \
           bench/pyproject.toml bench/setup.py bench/csrc/*.c)

.PHONY: install demo test asan test-rdma lint bench-deps bench-all accel-deps clean

install: $(STAMP)

$(STAMP): $(SOURCES)
	@./scripts/system-deps.sh
	@test -x $(PY) || { echo "==> creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo "==> Python dependencies into $(VENV)"
	@$(PIP) install -q --upgrade pip setuptools wheel
	@$(PIP) install -q pluggy pyzmq msgpack numpy click rich matplotlib prometheus-client \
	    pytest pytest-timeout hypothesis ruff
	@# NVIDIA's libcufile (1 MB, no CUDA needed to load it): the gds tests load the real library
	@$(PIP) install -q nvidia-cufile-cu12 || echo "nvidia-cufile-cu12 not installable here: its test skips"
	@# cuda-python's bindings (the preferred CUDA backend; they import without a GPU, so their
	@# loading and error paths are tested everywhere)
	@$(PIP) install -q cuda-bindings || echo "cuda-bindings not installable here: CUDA goes through ctypes"
	@echo "==> building tent-core, the plugins ($(PLUGINS)), refhub and tent-bench (editable)"
	@# tent-core first: the plugins' setup.py files build through tent_core.build
	@$(PIP) install -q --no-build-isolation -e .
	@$(PIP) install -q --no-build-isolation $(foreach d,$(PLUGIN_DIRS),-e $(d)) -e refhub -e bench
	@touch $(STAMP)
	@echo "==> installed: $(VENV)/bin/tent, $(VENV)/bin/refhub (make test, make demo)"

demo: install
	@$(VENV)/bin/tent demo

test: install
	$(PY) -m pytest -q

# The full RDMA suites inside Soft-RoCE guests: one guest (test_rdma_device.py) and two guests with two
# NICs each (test_rdma_two_vm.py); scripts/rdma-vm.sh installs QEMU, the kernel package, virtme-ng,
# rdma-core and perftest on first use (root). 10-40 min per suite under TCG. `make test` runs one guest
# with a subset of the first, under a hard cap (TENT_RDMA_VM_CI_BUDGET, 480 s, install included), and
# skips with the reason where the testbed cannot be set up or is too slow (docs/rdma-testbed.md).
# The bound on each suite's guests: the two-guest suite took 31 minutes on the loaded shared host.
TENT_RDMA_VM_TIMEOUT ?= 2400
test-rdma: install
	TENT_RDMA_VM=1 TENT_RDMA_VM_TIMEOUT=$(TENT_RDMA_VM_TIMEOUT) $(PY) -m pytest -q -rA -s plugins/rdma/tests/test_vm_suite.py

# pytest against an AddressSanitizer build of all our C (a copy under build/asan; the tree's own build
# stays): memory errors abort with the stacks of the access, the allocation and the free.
# ARGS: pytest arguments, e.g. make asan ARGS="tests/test_simdev_lifetime.py tests/test_ordering.py"
ASAN_ARGS ?= tests/test_simdev_lifetime.py tests/test_ordering.py plugins/tcp/tests plugins/shm/tests
asan: install
	./scripts/asan-test.sh -q $(or $(ARGS),$(ASAN_ARGS))

lint: install
	$(VENV)/bin/ruff check .

# Peers for side-by-side benchmarks (not needed by the tests).
bench-deps: install
	@command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && { dpkg -s libibverbs1 >/dev/null 2>&1 || \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1); } || true
	$(PIP) install -q mooncake-transfer-engine-non-cuda torch==2.13.0 ray xxhash

# Every table of docs/benchmarks.md, regenerated in one series of runs (root for the fabrics;
# ~25 minutes on a quiet 2-core machine). ARGS=--quick for a smoke test.
bench-all: install
	./scripts/bench-all.sh $(ARGS)

# CuPy (about 250 MB): its arrays are registered in a test where it imports (it cannot allocate
# without a GPU; the test wraps host memory it does not own)
accel-deps: install
	$(PIP) install -q cupy-cuda12x

clean:
	rm -rf $(VENV) build */build plugins/*/build *.egg-info plugins/*/*.egg-info
	find . -name '*.so' -path '*tent*' -delete
