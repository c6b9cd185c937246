# EveryCycle: `make run` serves the default model locally under supervisord; `make test` runs every test.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.everycycle-installed
VAR := $(CURDIR)/var
# Where the front (nginx) listens: HTTPS on HTTPS_PORT; plain HTTP on PORT serves too on a loopback HOST,
# and only redirects to HTTPS on any other address.
HOST ?= 127.0.0.1
PORT ?= 8080
HTTPS_PORT ?= 8443
# Extra `everycycle serve` options, e.g. SERVE_ARGS="--model /models/x.gguf --ctx-size 8192"
SERVE_ARGS ?=
# The governor's backend: simulated GPUs locally (a demo); "--backend nvml" on a box with NVIDIA cards.
GOVERNOR_ARGS ?= --backend simulator
# The BMC agent: hwmon where there is no BMC; "--backend ipmi --host H --user U --password-file F" with one.
BMC_ARGS ?= --backend local
BMC_LISTEN ?= 127.0.0.1:9290
PYTEST_ARGS ?=

.PHONY: install run test test-packages console status clean image image-dir image-test image-test-slow image-dir-test image-test-full \
	image-update-test

install: $(STAMP)

$(STAMP): pyproject.toml image/install-venv.sh
	@bash image/install-venv.sh $(VENV) $(VAR)/log
	@touch $@

run: $(STAMP)
	@mkdir -p $(VAR)/run $(VAR)/log $(VAR)/state && chmod 700 $(VAR)/state
	@# The development key, kept across runs (var/state/dev-api-key, 0600) so that yesterday's client still
	@# connects; the key file holds only its hash, stored again each run. rm that file for a new key.
	@dev=$(VAR)/state/dev-api-key; keys=$(VAR)/state/api_keys.json; \
	if [ -s $$dev ] && $(VENV)/bin/everycycle keys import --keys $$keys --key-file $$dev dev 2>/dev/null; then :; else \
	  $(VENV)/bin/everycycle keys revoke --keys $$keys --missing-ok dev && \
	  (umask 077; $(VENV)/bin/everycycle keys create --keys $$keys dev > $$dev.new 2>/dev/null) && mv $$dev.new $$dev; fi; \
	$(VENV)/bin/everycycle keys set-limit --keys $$keys dev --may-pull yes 2>/dev/null  # the owner's: it may pull
	@# The front's settings, through its own typed writer (a bad HOST or port is refused naming the field).
	@$(PY) -c 'import ipaddress, sys; from host_runtime.front.settings import FrontSettings, save; \
	  h = sys.argv[1]; save(FrontSettings(listen=h, http_port=int(sys.argv[2]), https_port=int(sys.argv[3]), \
	  http="serve" if ipaddress.ip_address(h).is_loopback else "redirect"), sys.argv[4])' \
	  $(HOST) $(PORT) $(HTTPS_PORT) $(VAR)/state/front.toml
	@key=$$(cat $(VAR)/state/dev-api-key); \
	export EVERYCYCLE_BIN=$(CURDIR)/$(VENV)/bin \
	       EVERYCYCLE_STATE_DIR=$(VAR)/state EVERYCYCLE_RUN_DIR=$(VAR)/run EVERYCYCLE_LOG_DIR=$(VAR)/log \
	       EVERYCYCLE_CACHE_DIR=$(VAR)/cache EVERYCYCLE_MODEL_STORE=$(VAR)/models EVERYCYCLE_SERVICE_USER=$$(id -un) \
	       EVERYCYCLE_GOVERNOR_USER=$$(id -un) EVERYCYCLE_FRONT_USER=$$(id -un) EVERYCYCLE_BMC_USER=$$(id -un) \
	       EVERYCYCLE_FLEET_USER=$$(id -un) EVERYCYCLE_FLEET_ADDRESS_USER=$$(id -un) EVERYCYCLE_SHARD_USER=$$(id -un) \
	       EVERYCYCLE_SERVE_ARGS="--usage-dir $(VAR)/usage $(SERVE_ARGS)" EVERYCYCLE_GOVERNOR_ARGS="$(GOVERNOR_ARGS)" \
	       EVERYCYCLE_BMC_ARGS="$(BMC_ARGS) --listen $(BMC_LISTEN)"; \
	$(VENV)/bin/supervisord -c supervisor.d/supervisord.conf & sup=$$!; \
	trap 'echo; echo "==> stopping"; kill -TERM $$sup 2>/dev/null; wait $$sup; exit 0' INT TERM; \
	echo "==> starting the box's services under supervisord (logs: var/log/)"; \
	for i in $$(seq 1 240); do \
	  if curl -sfk -o /dev/null https://$(HOST):$(HTTPS_PORT)/ready; then break; fi; \
	  kill -0 $$sup 2>/dev/null || { echo "supervisord exited; see var/log/" >&2; exit 1; }; sleep 0.5; \
	done; \
	curl -sfk -o /dev/null https://$(HOST):$(HTTPS_PORT)/ready || echo "!! not ready yet; see var/log/serving.log and front.log" >&2; \
	echo ""; \
	trust=$$($(VENV)/bin/everycycle front ca --state-dir $(VAR)/state | head -1 | awk '{print $$NF}'); \
	echo "  EveryCycle is serving on  https://$(HOST):$(HTTPS_PORT)/v1  (clients trust $$trust: the box's local CA)"; \
	echo "  its SHA-256:              $$($(VENV)/bin/everycycle front ca --state-dir $(VAR)/state | sed -n 2p | cut -d' ' -f3)"; \
	echo "  development API key:      $$key"; \
	echo "  try: curl --cacert $$trust https://localhost:$(HTTPS_PORT)/v1/chat/completions -H \"Authorization: Bearer $$key\" \\"; \
	echo "         -d '{\"model\": \"SmolLM2-135M-Instruct.Q4_1\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello!\"}]}'"; \
	echo "  status: $(VENV)/bin/supervisorctl -s unix://$(VAR)/run/supervisor.sock status   (Ctrl-C stops everything)"; \
	echo ""; \
	if [ -t 0 ] && [ -t 1 ] && [ -z "$(NO_CONSOLE)" ]; then \
	  echo "==> opening the console in 5 s (q leaves it and stops the box; NO_CONSOLE=1 skips it)"; sleep 5; \
	  $(VENV)/bin/everycycle console --allow-quit $(CONSOLE_ARGS); \
	  echo "==> stopping"; kill -TERM $$sup 2>/dev/null; wait $$sup; exit 0; \
	fi; \
	wait $$sup

# The dashboard (or its text form) for the box `make run` started, from a second terminal.
CONSOLE_ARGS = --run-dir $(VAR)/run --serving-socket $(VAR)/run/serving/http.sock --keys $(VAR)/state/api_keys.json \
	--front-settings $(VAR)/state/front.toml --state-dir $(VAR)/state \
	--bmc-url http://$(BMC_LISTEN)/telemetry --provision-root $(VAR)/root --bundle-dir $(VAR)/bundle
console: $(STAMP)
	@$(VENV)/bin/everycycle console $(CONSOLE_ARGS)

status: $(STAMP)
	@$(VENV)/bin/everycycle status $(CONSOLE_ARGS)

# The Debian packages the suite runs (ipmi_sim, nginx, lavapipe, sfdisk...) are installed first as root, or named
# in one line (with the apt-get command) before anything runs.
test: test-packages $(STAMP)
	@$(PY) -m pytest $(PYTEST_ARGS)

test-packages:
	@bash tests/system-packages.sh

clean:
	rm -rf $(VAR) .pytest_cache

# ---- the box image: Debian 13, built by mkosi 24 on a Debian 12 host (root; image/host-tools.sh installs it) ----
IMAGE_DIR := build/image/out
# NVIDIA=1: the disk image carries the NVIDIA driver (DKMS-built for its kernel) and llama.cpp's CUDA build,
# compiled once in the build overlay (about 25 minutes per architecture on 2 cores) and cached; NVIDIA=0
# leaves both out. CUDA_ARCHS (image/build.sh's default: 61-real,75-real,86-real,89) narrows the build.
NVIDIA ?= 1
export NVIDIA CUDA_ARCHS

# The bootable disk image: prints its path, size and sha256, and writes its update files to build/image/out/update
# (signed by UPDATE_KEY=FILE, an Ed25519 private key in PEM; refused without one unless DEV_UPDATE_KEY=1, a
# development key for tests). The image-test targets below use the development key unless UPDATE_KEY is given.
DEV_UPDATE_KEY ?=
TEST_DEV_KEY = $(if $(UPDATE_KEY),,DEV_UPDATE_KEY=1)
image: $(STAMP)
	@bash image/build.sh disk

# The same system as a directory tree, which systemd-nspawn boots (CI's boot test).
image-dir: $(STAMP)
	@bash image/build.sh directory

# Boot the disk image under qemu (UEFI, software emulation) and check it from outside.
image-test: $(STAMP)
	@bash image/host-tools.sh --boot
	@[ -f $(IMAGE_DIR)/everycycle.raw ] || $(TEST_DEV_KEY) bash image/build.sh disk
	@$(PY) image/boot_check.py qemu $(IMAGE_DIR)/everycycle.raw $(if $(filter 1,$(NVIDIA)),--nvidia)

# The same boot on a slow box: qemu's two CPUs held to SLOW_QUOTA% of one (about 2x slower here), so that the
# readiness canary takes over 10 s; /ready must wait for it (slow is not wedged), and the check fails unless it did.
SLOW_QUOTA ?= 100
image-test-slow: $(STAMP)
	@bash image/host-tools.sh --boot
	@[ -f $(IMAGE_DIR)/everycycle.raw ] || $(TEST_DEV_KEY) bash image/build.sh disk
	@$(PY) image/boot_check.py qemu $(IMAGE_DIR)/everycycle.raw --cpu-quota $(SLOW_QUOTA) --slow-canary 10

# Build the directory image and boot it in systemd-nspawn: what CI runs every time.
image-dir-test: image-dir
	@$(PY) image/boot_check.py nspawn $(IMAGE_DIR)/everycycle

# Everything: build the disk, boot it under qemu, build it again and compare the two sha256 sums (the disks and
# the update files).
image-test-full: $(STAMP)
	@bash image/host-tools.sh --boot
	@$(TEST_DEV_KEY) bash image/build.sh disk
	@cp $(IMAGE_DIR)/everycycle.raw.sha256 build/image/first.sha256
	@cp $(IMAGE_DIR)/update/SHA256SUMS build/image/first.SHA256SUMS
	@$(PY) image/boot_check.py qemu $(IMAGE_DIR)/everycycle.raw $(if $(filter 1,$(NVIDIA)),--nvidia)
	@$(TEST_DEV_KEY) bash image/build.sh disk
	@echo "==> reproducibility: two builds of $$(git rev-parse --short HEAD)"; \
	a=$$(cut -d' ' -f1 build/image/first.sha256); b=$$(cut -d' ' -f1 $(IMAGE_DIR)/everycycle.raw.sha256); \
	echo "    first:  $$a"; echo "    second: $$b"; \
	if [ "$$a" = "$$b" ]; then echo "    identical"; else echo "    DIFFERENT" >&2; exit 1; fi; \
	if cmp -s build/image/first.SHA256SUMS $(IMAGE_DIR)/update/SHA256SUMS; then echo "    update files identical"; \
	else echo "    update files DIFFERENT" >&2; diff build/image/first.SHA256SUMS $(IMAGE_DIR)/update/SHA256SUMS >&2; exit 1; fi

# A/B updates under qemu (image/update_check.py): v1's disk, v2 (the same tree, another version) and v3 (serving
# broken on purpose) as update files served over HTTP; a tampered release refused, v1 -> v2 blessed, a power cut
# during apply, v3 rolled back by itself. NVIDIA=0 unless given. UPDATE_STEPS=tamper,update runs the first two
# (what CI runs).
UPDATE_TEST := build/image/update-test
UPDATE_STEPS ?= tamper,update,power-cut,rollback
# A pass is recorded in .ci/update-test-passed.json with the test's inputs (.ci/update_test_gate.py): CI runs the
# test again only when one of them has changed since.
image-update-test: $(STAMP)
	@bash image/host-tools.sh --boot
	@start=$$(date +%s); \
	NVIDIA=$(if $(filter command line,$(origin NVIDIA)),$(NVIDIA),0) bash image/update-test-build.sh $(UPDATE_TEST) \
	  $(if $(findstring power-cut,$(UPDATE_STEPS))$(findstring rollback,$(UPDATE_STEPS)),v2 v3,v2) && \
	$(PY) image/update_check.py $(UPDATE_TEST) --only $(UPDATE_STEPS) && \
	$(PY) .ci/update_test_gate.py record $(UPDATE_STEPS) $$(( $$(date +%s) - start ))

# ---- benchmark references (built outside the repo; nothing built is committed) ----
BENCH_CACHE ?= $(HOME)/.cache/everycycle/bench-ref
LLAMA_PIN := $(shell grep -oE 'llama-cpp-python==[0-9.]+' pyproject.toml)
LLAMA_SERVER := $(BENCH_CACHE)/$(subst ==,-,$(LLAMA_PIN))/build/bin/llama-server
# With llama.cpp's RPC backend and its ggml-rpc-server: the reference for one model across boxes (bench/shard.py).
RPC_SERVER := $(dir $(LLAMA_SERVER))ggml-rpc-server

.PHONY: bench-ref bench

bench-ref: $(LLAMA_SERVER) $(RPC_SERVER)

# The C++ llama-server (and ggml-rpc-server) from the llama.cpp that the pinned llama-cpp-python vendors: same kernels,
# same model.
$(LLAMA_SERVER) $(RPC_SERVER) &:
	@mkdir -p $(BENCH_CACHE)
	@src=$(BENCH_CACHE)/$(subst ==,-,$(LLAMA_PIN)); \
	if [ ! -d $$src/vendor/llama.cpp ]; then \
	  echo "==> fetching the $(LLAMA_PIN) source distribution"; \
	  $(VENV)/bin/pip download -q --no-deps --no-binary :all: -d $(BENCH_CACHE) "$(LLAMA_PIN)" && \
	  mkdir -p $$src && tar -xzf $(BENCH_CACHE)/llama_cpp_python-*.tar.gz -C $$src --strip-components=1; \
	fi; \
	echo "==> building llama-server (several minutes on 2 cores; log: $$src/build.log)"; \
	cmake -S $$src/vendor/llama.cpp -B $$src/build -DCMAKE_BUILD_TYPE=Release -DLLAMA_USE_PREBUILT_UI=OFF \
	  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
	  -DLLAMA_BUILD_TOOLS=ON -DGGML_RPC=ON -DGGML_RPC_RDMA=OFF > $$src/build.log 2>&1 && \
	cmake --build $$src/build --target llama-server ggml-rpc-server -j$$(nproc) >> $$src/build.log 2>&1 \
	  || { tail -30 $$src/build.log; exit 1; }
	@echo "built $(LLAMA_SERVER) and $(RPC_SERVER)"

bench: $(STAMP) bench-ref
	@$(VENV)/bin/pip install -q -e '.[bench]'
	@$(PY) bench/serving.py --llama-server $(LLAMA_SERVER) $(BENCH_ARGS)
