"""Embedding throughput: raw vLLM pooling vs ``Engine.embed`` vs the two integration classes.

    python benchmarks/embeddings.py [--model PATH_OR_ID] [--texts 512] [--words 24] [--rounds 3]
                                    [--json]

All variants run on one pooling engine, in one process, on the same texts:

- ``raw vLLM``: ``AsyncLLM`` used directly on the engine's loop, as vLLM's own embedding server
  does it (``renderer.render_cmpl_async`` for all texts, then one ``AsyncLLM.encode`` per text,
  all gathered). No vllm-inline code on the path: the baseline.
- ``Engine.embed`` (sync, from this thread) and ``Engine.aembed`` (from another event loop).
- LangChain ``VLLMEmbeddings.embed_documents`` and LlamaIndex
  ``VLLMEmbedding.get_text_embedding_batch``.

Each variant is warmed up once, then the rounds interleave all variants; a variant's best
round counts. Prints texts/s and
the ratio to raw vLLM (1.00x = no overhead). Without ``--model`` it builds the tiny local
embedder (:func:`vllm_inline.testing.build_embedding_model`), so it runs offline. ``--json``
prints one JSON object instead (for ``benchmarks/run.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from measure import best_times
from texts import random_texts

from vllm_inline.testing import CPU_TEST_ENGINE_KWARGS, build_embedding_model


async def _raw_embed(llm: Any, texts: list[str]) -> list[list[float]]:
    """vLLM's API only: what its embedding server does for one request of ``texts``."""
    from vllm import PoolingParams
    from vllm.renderers.inputs.preprocess import parse_model_prompt

    renderer = llm.renderer
    inputs = await renderer.render_cmpl_async(
        [parse_model_prompt(llm.model_config, t) for t in texts], renderer.default_cmpl_tok_params
    )
    params = PoolingParams(task="embed")

    async def one(i: int, engine_input: Any) -> list[float]:
        async for out in llm.encode(engine_input, params, f"bench-raw-{time.monotonic_ns()}-{i}"):
            last = out
        return last.outputs.data.tolist()

    return list(await asyncio.gather(*(one(i, x) for i, x in enumerate(inputs))))


def run(
    model: str | None, n_texts: int, words: int, rounds: int, vllm_kwargs: dict[str, Any]
) -> dict[str, Any]:
    from vllm_inline.engine import get_engine
    from vllm_inline.integrations.langchain import VLLMEmbeddings
    from vllm_inline.integrations.llama_index import VLLMEmbedding

    if model is None:
        model = str(build_embedding_model())
    kwargs = {"runner": "pooling", **vllm_kwargs}
    engine = get_engine(model, **kwargs)
    t0 = time.perf_counter()
    runtime = engine.runtime  # the raw baseline needs the AsyncLLM and its loop
    start_s = time.perf_counter() - t0
    texts = random_texts(n_texts, words)
    lc = VLLMEmbeddings(model=model, vllm_kwargs=vllm_kwargs)
    li = VLLMEmbedding(model=model, vllm_kwargs=vllm_kwargs)
    assert lc.engine is engine and li.engine is engine

    variants: dict[str, Callable[[], list[list[float]]]] = {
        "raw vLLM pooling (AsyncLLM.encode)": lambda: runtime.loop.submit(
            _raw_embed(runtime.llm, texts)
        ).result(),
        "Engine.embed": lambda: engine.embed(texts),
        "Engine.aembed": lambda: asyncio.run(engine.aembed(texts)),
        "LangChain VLLMEmbeddings.embed_documents": lambda: lc.embed_documents(texts),
        "LlamaIndex VLLMEmbedding.get_text_embedding_batch": lambda: li.get_text_embedding_batch(
            texts
        ),
    }
    reference: list[list[float]] | None = None
    for name, fn in variants.items():
        vectors = fn()  # warm-up (and a correctness check against the raw vectors)
        if reference is None:
            reference = vectors
        elif len(vectors) != len(reference) or any(
            abs(a - b) > 1e-4 for v, r in zip(vectors, reference) for a, b in zip(v, r)
        ):
            raise AssertionError(f"{name}: vectors differ from raw vLLM's")
    best = best_times(variants, rounds)  # rounds interleave the variants
    results = {name: n_texts / seconds for name, seconds in best.items()}
    tokens = sum(len(engine.tokenizer.encode(t, add_special_tokens=True)) for t in texts) / n_texts
    raw = next(iter(results.values()))
    return {
        "model": model,
        "texts": n_texts,
        "mean_tokens": round(tokens, 1),
        "rounds": rounds,
        "engine_start_s": round(start_s, 1),
        "texts_per_s": {k: round(v, 1) for k, v in results.items()},
        "ratio_to_raw": {k: round(v / raw, 3) for k, v in results.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="embedding model (default: tiny local one)")
    parser.add_argument("--texts", type=int, default=512)
    parser.add_argument("--words", type=int, default=24, help="words per text")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--vllm-kwargs", default=None, help="JSON AsyncEngineArgs (default: CPU test settings)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    vllm_kwargs = json.loads(args.vllm_kwargs) if args.vllm_kwargs else dict(CPU_TEST_ENGINE_KWARGS)
    report = run(args.model, args.texts, args.words, args.rounds, vllm_kwargs)
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"embeddings: {report['texts']} texts x ~{report['mean_tokens']} tokens, "
            f"best of {report['rounds']}, model {report['model']}"
        )
        for name, rate in report["texts_per_s"].items():
            print(f"  {name:<52} {rate:>9.1f} texts/s  {report['ratio_to_raw'][name]:.2f}x raw")
    from vllm_inline.engine import shutdown_all

    shutdown_all()
    return 0


if __name__ == "__main__":  # the engine core is a spawned process: keep this guard
    sys.exit(main())
