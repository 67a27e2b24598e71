"""An app on three engines (a chat model, an embedder, a reranker) that uses every class of the
package once, then ends the way ``sys.argv[1]`` says, without calling any shutdown
(tests/parallel/test_clean_exit.py).

    python ending_app.py HOW CHAT_MODEL EMBEDDER RERANKER ENGINE_KWARGS_JSON

HOW: ``end`` (the script ends), ``break`` (a stream left by ``break``, then the end),
``exit`` (``sys.exit`` in the middle of a LlamaIndex stream), ``raise`` (an exception out of
``main`` under ``asyncio.run``, a LangChain ``astream`` in flight), ``ctrl-c`` (SIGINT to the
app's process group, as a terminal's Ctrl-C sends it, in the middle of a ``ChatVLLM.stream``
consumed slowly; the test starts the app leading a process group of its own).
No ``__main__`` guard on purpose: the package's engine processes do not run the script again.
"""

import asyncio
import json
import os
import signal
import sys
import time

from langchain_core.documents import Document
from llama_index.core.llms import ChatMessage
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from vllm_inline.engine import get_engine
from vllm_inline.integrations import langchain as lc
from vllm_inline.integrations import llama_index as li

how, chat_model, embedder, reranker = sys.argv[1:5]
if how == "ctrl-c":
    # As in a terminal, whatever the runner gave: a shell's background job (`make ... &`)
    # starts with SIGINT ignored, and Python then keeps it ignored (no KeyboardInterrupt).
    signal.signal(signal.SIGINT, signal.default_int_handler)
kwargs = json.loads(sys.argv[5])
DOCS = ["Oslo is cold in winter.", "Bananas are yellow."]
QUESTION = "How cold is Oslo?"

chat = lc.ChatVLLM(model=chat_model, vllm_kwargs=kwargs, max_tokens=8)
llm = li.VLLM(model=chat_model, vllm_kwargs=kwargs, max_tokens=8)
engine = get_engine(chat_model, **kwargs)
print("ChatVLLM:", chat.invoke("Hi").content, flush=True)
print("VLLM:", llm.chat([ChatMessage(role="user", content="Hi")]).message.content)
hi = [{"role": "user", "content": "Hi"}]
print("Engine:", "".join(d.text for d in engine.stream(hi, max_tokens=8)))
print(
    "VLLMEmbeddings:", len(lc.VLLMEmbeddings(model=embedder, vllm_kwargs=kwargs).embed_query("a"))
)
print(
    "VLLMEmbedding:",
    len(li.VLLMEmbedding(model=embedder, vllm_kwargs=kwargs).get_text_embedding("a")),
)
documents = [Document(page_content=d) for d in DOCS]
ranked = lc.VLLMRerank(model=reranker, vllm_kwargs=kwargs, top_n=2).compress_documents(
    documents, QUESTION
)
print("VLLMRerank (LangChain):", len(ranked))
nodes = [NodeWithScore(node=TextNode(text=d)) for d in DOCS]
postprocessor = li.VLLMRerank(model=reranker, vllm_kwargs=kwargs, top_n=2)
print(
    "VLLMRerank (LlamaIndex):", len(postprocessor.postprocess_nodes(nodes, QueryBundle(QUESTION)))
)

long = lc.ChatVLLM(model=chat_model, vllm_kwargs=kwargs, max_tokens=400)
if how == "break":
    for delta in engine.stream(hi, max_tokens=400):
        print("first delta:", bool(delta.text))
        break
elif how == "exit":
    for response in li.VLLM(model=chat_model, vllm_kwargs=kwargs, max_tokens=400).stream_chat(
        [ChatMessage(role="user", content="Hi")]
    ):
        print("exit in the middle of a stream", flush=True)
        sys.exit(0)
elif how == "raise":

    async def main() -> None:
        async for _ in long.astream("Hi"):
            raise RuntimeError("the app failed in the middle of a stream")

    asyncio.run(main())
elif how == "ctrl-c":
    for chunk in long.stream("Hi"):
        print("Ctrl-C in the middle of a stream", flush=True)
        os.killpg(os.getpgrp(), signal.SIGINT)
        time.sleep(30)
elif how != "end":
    raise SystemExit(f"unknown ending {how!r}")
