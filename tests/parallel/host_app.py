"""A process of the user's on the host engines (tests/parallel/test_host_engine.py): every feature
of the classes through engines it attaches to (``keep_alive``), printed as one JSON line.

    python host_app.py SPEC_JSON

SPEC: ``chat`` (llama3, started with LoRA), ``adapters`` (name -> directory), ``tools``
(chatml_tools), ``reasoning`` (chatml_reasoning), ``vision`` (Idefics3), ``embedder``,
``reranker``: model paths; ``kwargs`` (the chat engines' options), ``lora_kwargs``,
``vision_kwargs``; ``keep_alive``. With ``"hold": true`` it then streams a long answer slowly,
printing ``STREAMING`` at its first chunk, until it is killed.
"""

import base64
import io
import json
import sys
import time

from langchain_core.tools import tool
from llama_index.core.llms import ChatMessage
from PIL import Image

from vllm_inline.engine import get_engine
from vllm_inline.integrations import langchain as lc
from vllm_inline.integrations import llama_index as li

spec = json.loads(sys.argv[1])
keep = spec["keep_alive"]
out = {}

chat = lc.ChatVLLM(
    model=spec["chat"], vllm_kwargs=spec["lora_kwargs"], temperature=0, keep_alive=keep
)
chunks = [c.content for c in chat.stream("Hi")]
out["chat"] = {"text": "".join(chunks), "chunks": len(chunks)}
out["lora"] = {
    name: chat.invoke("Hi", lora=path).content for name, path in spec["adapters"].items()
}
llm = li.VLLM(model=spec["chat"], vllm_kwargs=spec["lora_kwargs"], keep_alive=keep)
out["llama_index"] = "".join(
    r.delta for r in llm.stream_chat([ChatMessage(role="user", content="Hi")])
)


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return "sunny"


tools = lc.ChatVLLM(
    model=spec["tools"], vllm_kwargs=spec["kwargs"], tool_parser="hermes", keep_alive=keep
)
message = tools.bind_tools([get_weather]).invoke("Weather in Oslo?")
out["tools"] = [{"name": c["name"], "args": c["args"]} for c in message.tool_calls]

thinker = lc.ChatVLLM(
    model=spec["reasoning"], vllm_kwargs=spec["kwargs"], reasoning_parser="qwen3", keep_alive=keep
)
answer = thinker.invoke("Hi")
out["reasoning"] = {
    "reasoning": answer.additional_kwargs.get("reasoning_content", "").strip(),
    "content": answer.content,
}

png = io.BytesIO()
Image.new("RGB", (64, 64), "red").save(png, "PNG")
url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
image_chat = [
    {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "What is in this image?"},
        ],
    }
]
vision = get_engine(spec["vision"], keep_alive=keep, **spec["vision_kwargs"])
out["image"] = [
    i for d in vision.stream(image_chat, max_tokens=8, temperature=0) for i in d.token_ids
]

embeddings = lc.VLLMEmbeddings(model=spec["embedder"], vllm_kwargs=spec["kwargs"], keep_alive=keep)
out["embeddings"] = embeddings.embed_documents(["Oslo is cold.", "Bananas are yellow."])
reranker = get_engine(spec["reranker"], keep_alive=keep, runner="pooling", **spec["kwargs"])
out["scores"] = reranker.score("How cold is Oslo?", ["Oslo is cold.", "Bananas are yellow."])
out["owners"] = sorted({e.host_status()["pid"] for e in (chat.engine, vision, reranker)})
print("RESULT", json.dumps(out), flush=True)

if spec.get("hold"):
    slow = lc.ChatVLLM(
        model=spec["chat"], vllm_kwargs=spec["lora_kwargs"], max_tokens=3500, keep_alive=keep
    )
    for chunk in slow.stream("Hi", ignore_eos=True):
        print("STREAMING", flush=True)
        time.sleep(0.5)
