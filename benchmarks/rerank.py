"""Reranking throughput: ``vllm.LLM.score`` vs ``Engine.score`` vs the two ``VLLMRerank`` classes.

    python benchmarks/rerank.py [--model PATH_OR_ID] [--pairs 256] [--words 24] [--rounds 3]
                                [--json]

Every variant scores the same query against the same documents (one query, ``--pairs``
documents, the rerank shape of a RAG pipeline), in one process:

- ``vllm.LLM.score``: vLLM's own offline API on its own ``vllm.LLM`` (same model and engine
  options): the baseline the issue asks for (target: every vllm-inline line >= 0.95x).
- ``raw AsyncLLM``: vLLM's ``/score`` server path on the very ``AsyncLLM`` vllm-inline started,
  on its loop: ``CrossEncoderIOProcessor.render_async`` for every pair, then one
  ``AsyncLLM.encode`` per pair, all gathered. No vllm-inline code on the path.
- ``Engine.score`` (sync, from this thread) and ``Engine.ascore`` (from another event loop).
- LangChain ``VLLMRerank.compress_documents`` and LlamaIndex ``VLLMRerank.postprocess_nodes``
  (``top_n=None``: every document scored and returned).

Each variant is warmed up once (and its scores checked against ``LLM.score``'s), then the rounds
interleave all variants; a variant's best round counts. Prints pairs/s and the ratio to
``LLM.score``. Without ``--model`` it builds the tiny local reranker
(:mod:`vllm_inline.testing.reranker`), so it runs offline. ``--json`` prints one JSON object.
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

CPU_ENGINE_KWARGS: dict[str, Any] = {
    "dtype": "float32",
    "max_model_len": 512,
    "enforce_eager": True,
    "kv_cache_memory_bytes": 128 * 2**20,
}

QUERY = "How is the weather in Oslo in winter?"


async def _raw_score(llm: Any, query: str, documents: list[str]) -> list[float]:
    """vLLM's API only: what its ``/score`` server does for one 1 -> N request."""
    from vllm import PoolingParams
    from vllm.entrypoints.pooling.scoring.io_processor import CrossEncoderIOProcessor
    from vllm.entrypoints.pooling.typing import ScoringRenderParams
    from vllm.outputs import ScoringRequestOutput
    from vllm.renderers.chat_utils import ChatTemplateConfig

    processor = _raw_processors.get(id(llm))
    if processor is None:
        processor = _raw_processors[id(llm)] = CrossEncoderIOProcessor(
            vllm_config=llm.vllm_config,
            renderer=llm.renderer,
            chat_template_config=ChatTemplateConfig(),
        )
    tok_params = llm.renderer.default_cmpl_tok_params
    params = PoolingParams(task="classify")
    inputs = await asyncio.gather(
        *(
            processor.render_async(
                ScoringRenderParams(
                    data_1=query,
                    data_2=doc,
                    chat_template=None,
                    max_tokens_per_query=0,
                    max_tokens_per_doc=0,
                    tok_params=tok_params,
                    prompt_extras=None,
                    skip_mm_cache=False,
                    params=params,
                    lora_requests=None,
                    priorities=0,
                )
            )
            for doc in documents
        )
    )

    async def one(i: int, x: Any) -> float:
        request_id = f"bench-raw-{time.monotonic_ns()}-{i}"
        async for out in llm.encode(x["prompts"], x["params"], request_id):
            last = out
        return ScoringRequestOutput.from_base(last).outputs.score

    return list(await asyncio.gather(*(one(i, x) for i, x in enumerate(inputs))))


_raw_processors: dict[int, Any] = {}


def run(
    model: str | None, n_pairs: int, words: int, rounds: int, vllm_kwargs: dict[str, Any]
) -> dict[str, Any]:
    import vllm
    from langchain_core.documents import Document
    from llama_index.core.schema import NodeWithScore, TextNode

    from vllm_inline.engine import get_engine
    from vllm_inline.integrations.langchain import VLLMRerank as LCRerank
    from vllm_inline.integrations.llama_index import VLLMRerank as LIRerank

    if model is None:
        from vllm_inline.testing.reranker import build_reranker_model

        model = str(build_reranker_model())
    engine = get_engine(model, runner="pooling", **vllm_kwargs)
    t0 = time.perf_counter()
    runtime = engine.runtime  # the raw baseline needs the AsyncLLM and its loop
    start_s = time.perf_counter() - t0
    offline = vllm.LLM(model, runner="pooling", **vllm_kwargs)
    documents = random_texts(n_pairs, words)
    lc = LCRerank(model=model, vllm_kwargs=vllm_kwargs, top_n=None)
    li = LIRerank(model=model, vllm_kwargs=vllm_kwargs, top_n=None)
    assert lc.engine is engine and li.engine is engine
    lc_docs = [Document(page_content=d, metadata={"i": i}) for i, d in enumerate(documents)]
    li_nodes = [NodeWithScore(node=TextNode(text=d, id_=str(i))) for i, d in enumerate(documents)]

    def lc_scores() -> list[float]:
        out = lc.compress_documents(lc_docs, QUERY)
        return _in_order([(d.metadata["i"], d.metadata["relevance_score"]) for d in out])

    def li_scores() -> list[float]:
        out = li.postprocess_nodes(li_nodes, query_str=QUERY)
        return _in_order([(int(n.node.node_id), n.score) for n in out])

    variants: dict[str, Callable[[], list[float]]] = {
        "vllm.LLM.score": lambda: [
            o.outputs.score for o in offline.score(QUERY, documents, use_tqdm=False)
        ],
        "raw AsyncLLM (vLLM's /score path)": lambda: runtime.loop.submit(
            _raw_score(runtime.llm, QUERY, documents)
        ).result(),
        "Engine.score": lambda: engine.score(QUERY, documents),
        "Engine.ascore": lambda: asyncio.run(engine.ascore(QUERY, documents)),
        "LangChain VLLMRerank.compress_documents": lc_scores,
        "LlamaIndex VLLMRerank.postprocess_nodes": li_scores,
    }
    reference: list[float] | None = None
    for name, fn in variants.items():
        scores = fn()  # warm-up (and a correctness check against LLM.score's)
        if reference is None:
            reference = scores
        elif len(scores) != len(reference) or any(
            abs(a - b) > 1e-4 for a, b in zip(scores, reference)
        ):
            raise AssertionError(f"{name}: scores differ from vllm.LLM.score's")
    best = best_times(variants, rounds)  # rounds interleave the variants
    results = {name: n_pairs / seconds for name, seconds in best.items()}
    tok = engine.tokenizer
    tokens = sum(len(tok(QUERY, d)["input_ids"]) for d in documents) / n_pairs
    baseline = results["vllm.LLM.score"]
    return {
        "model": model,
        "pairs": n_pairs,
        "mean_tokens": round(tokens, 1),
        "rounds": rounds,
        "engine_start_s": round(start_s, 1),
        "pairs_per_s": {k: round(v, 1) for k, v in results.items()},
        "ratio_to_llm_score": {k: round(v / baseline, 3) for k, v in results.items()},
    }


def _in_order(indexed: list[tuple[int, float]]) -> list[float]:
    return [score for _, score in sorted(indexed)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="reranker model (default: tiny local one)")
    parser.add_argument("--pairs", type=int, default=256, help="documents scored per call")
    parser.add_argument("--words", type=int, default=24, help="words per document")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--vllm-kwargs", default=None, help="JSON AsyncEngineArgs (default: CPU test settings)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    vllm_kwargs = json.loads(args.vllm_kwargs) if args.vllm_kwargs else dict(CPU_ENGINE_KWARGS)
    report = run(args.model, args.pairs, args.words, args.rounds, vllm_kwargs)
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"rerank: 1 query x {report['pairs']} documents (~{report['mean_tokens']} tokens a "
            f"pair), best of {report['rounds']}, model {report['model']}"
        )
        for name, rate in report["pairs_per_s"].items():
            ratio = report["ratio_to_llm_score"][name]
            flag = (
                ""
                if name == "vllm.LLM.score"
                else ("  ok (>= 0.95x)" if ratio >= 0.95 else "  BELOW 0.95x")
            )
            print(f"  {name:<44} {rate:>9.1f} pairs/s  {ratio:.2f}x LLM.score{flag}")
    from vllm_inline.engine import shutdown_all

    shutdown_all()
    return 0


if __name__ == "__main__":  # the engine core is a spawned process: keep this guard
    sys.exit(main())
