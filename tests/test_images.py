"""Images in, text out, on a real engine: the tiny Idefics3 of the test kit (SmolVLM architecture).

One Idefics3 engine for the module (``VISION_ENGINE_KWARGS``: at most two images per prompt, and
one allowed local directory), shut down at the end. The model has random weights, so its answer
is noise; but greedy noise that ``transformers.generate`` reproduces on the same directory, and
that changes with the image: so each answer here is checked against transformers' ids.
"""

from __future__ import annotations

import asyncio
import base64
import io
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from langchain_core.messages import HumanMessage
from llama_index.core.base.llms.types import ChatMessage, ImageBlock, TextBlock
from PIL import Image

from vllm_inline.engine import BadRequestError, Engine, get_engine
from vllm_inline.integrations.langchain import ChatVLLM
from vllm_inline.integrations.llama_index import VLLM
from vllm_inline.testing import VISION_ENGINE_KWARGS, build_vision_model

pytestmark = pytest.mark.engine

QUESTION = "What is in this image?"
MAX_TOKENS = 8


def _png(color: str, size: tuple[int, int] = (64, 64)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, "PNG")
    return out.getvalue()


def _data_url(png: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(png).decode()}"


def _chat(*images: Any, text: str = QUESTION) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [*images, {"type": "text", "text": text}]}]


def _url_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


class Vision:
    """The module's model, its engine options, the allowed directory and the reference ids."""

    def __init__(self, path: Path, media: Path, outside: Path) -> None:
        self.path = str(path)
        self.media = media
        self.outside = outside
        # 127.0.0.1 only: remote URLs of any other domain are still refused.
        self.vllm_kwargs = {
            **VISION_ENGINE_KWARGS,
            "allowed_local_media_path": str(media),
            "allowed_media_domains": ["127.0.0.1"],
        }
        self.reference: dict[str, list[int]] = {}
        self.prompt_tokens: dict[str, int] = {}

    @property
    def engine(self) -> Engine:
        return get_engine(self.path, **self.vllm_kwargs)


def _transformers_greedy(
    path: str, colors: tuple[str, ...]
) -> tuple[dict[str, list[int]], dict[str, int]]:
    """transformers' greedy ids for one image and QUESTION, per colour, and the prompt sizes."""
    import torch
    from transformers import AutoProcessor, Idefics3ForConditionalGeneration

    processor = AutoProcessor.from_pretrained(path)
    model = Idefics3ForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}
    ]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    ids, sizes = {}, {}
    for color in colors:
        image = Image.open(io.BytesIO(_png(color)))
        inputs = processor(
            text=prompt, images=[image], return_tensors="pt", add_special_tokens=False
        )
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=MAX_TOKENS, do_sample=False)
        sizes[color] = int(inputs["input_ids"].shape[1])
        ids[color] = out[0, sizes[color] :].tolist()
    del model
    return ids, sizes


@pytest.fixture(scope="module")
def vision(scripted_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vision]:
    media = tmp_path_factory.mktemp("allowed-media")
    outside = tmp_path_factory.mktemp("not-allowed")
    for directory in (media, outside):
        (directory / "red.png").write_bytes(_png("red"))
    v = Vision(build_vision_model(scripted_root), media, outside)
    v.reference, v.prompt_tokens = _transformers_greedy(v.path, ("red", "blue"))
    yield v
    v.engine.shutdown()


def _ids(deltas: list[Any]) -> list[int]:
    return [i for d in deltas for i in d.token_ids]


# -- the engine -------------------------------------------------------------------------------


def test_two_images_give_different_answers_each_equal_to_transformers(vision: Vision) -> None:
    assert vision.reference["red"] != vision.reference["blue"]
    for color in ("red", "blue"):
        deltas = list(
            vision.engine.stream(
                _chat(_url_part(_data_url(_png(color)))), max_tokens=MAX_TOKENS, temperature=0
            )
        )
        assert _ids(deltas) == vision.reference[color], color
        # The prompt counts the image tokens the processor expanded, as transformers does.
        assert deltas[-1].usage.prompt_tokens == vision.prompt_tokens[color]
        # A final-only request (one delta, vLLM's FINAL_ONLY output) gives the same greedy ids.
        (final,) = vision.engine.stream(
            _chat(_url_part(_data_url(_png(color)))),
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=False,
        )
        assert list(final.token_ids) == vision.reference[color], color


def test_image_streamed_through_the_engine_async(vision: Vision) -> None:
    async def run() -> list[Any]:
        chat = _chat(_url_part(_data_url(_png("blue"))))
        return [d async for d in vision.engine.astream(chat, max_tokens=MAX_TOKENS, temperature=0)]

    deltas = asyncio.run(run())
    assert len(deltas) > 1 and deltas[-1].finish_reason == "length"
    assert _ids(deltas) == vision.reference["blue"]


@pytest.mark.parametrize(
    "form",
    ["bytes", "pil", "image-part", "path", "file-url", "image_pil"],
)
def test_every_image_form_gives_the_same_answer(vision: Vision, form: str) -> None:
    png = _png("red")
    path = vision.media / "red.png"
    part = {
        "bytes": png,
        "pil": Image.open(io.BytesIO(png)),
        "image-part": {"type": "image", "image": png},
        "path": _url_part(str(path)),
        "file-url": _url_part(path.as_uri()),
        "image_pil": {"type": "image_pil", "image_pil": Image.open(io.BytesIO(png))},
    }[form]
    deltas = list(vision.engine.stream(_chat(part), max_tokens=MAX_TOKENS, temperature=0))
    assert _ids(deltas) == vision.reference["red"]


def test_prompt_token_ids_count_the_image_tokens(vision: Vision) -> None:
    with_image = vision.engine.prompt_token_ids(_chat(_url_part(_data_url(_png("red")))))
    text_only = vision.engine.prompt_token_ids([{"role": "user", "content": QUESTION}])
    assert len(with_image) == vision.prompt_tokens["red"] > len(text_only) + 20
    assert vision.engine.accepts_images


def test_an_image_counted_before_it_is_sent_still_gets_its_answer(vision: Vision) -> None:
    """Counting renders the image through vLLM's processor, whose front-end cache then takes it
    for sent to the engine core: the next request with it came back with no token and
    finish_reason 'error' (vLLM's retryable cache-drift answer). The engine renders it again
    and retries once. The colour is this test's own, so no other test has sent it before."""
    chat = _chat(_url_part(_data_url(_png("#0cc863"))))
    counted = vision.engine.prompt_token_ids(chat)
    deltas = list(vision.engine.stream(chat, max_tokens=MAX_TOKENS, temperature=0))
    assert deltas[-1].finish_reason == "length"
    assert deltas[-1].usage.prompt_tokens == len(counted)
    again = list(vision.engine.stream(chat, max_tokens=MAX_TOKENS, temperature=0))
    assert _ids(deltas) == _ids(again) and len(_ids(deltas)) == MAX_TOKENS


def _bad_requests(vision: Vision) -> list[tuple[str, list[dict[str, Any]], str, str]]:
    red = _url_part(_data_url(_png("red")))
    truncated = _png("red")[:40]
    return [
        ("too-many-images", _chat(red, red, red), "messages[0].content[2]", "at most 2"),
        (
            "corrupt-base64",
            _chat(_url_part("data:image/png;base64,not*base64!")),
            "messages[0].content[0]",
            "corrupt",
        ),
        (
            "not-an-image",
            _chat(_url_part(_data_url(truncated))),
            "messages[0].content[0]",
            "not a readable image",
        ),
        (
            "unsupported-mime",
            _chat(_url_part(_data_url(b"%PDF-1.4", "application/pdf"))),
            "messages[0].content[0]",
            "MIME type",
        ),
        (
            "remote-url",
            _chat(_url_part("https://example.com/cat.png")),
            "messages[0].content[0]",
            "remote image URLs are refused",
        ),
        (
            "outside-allowed-dir",
            _chat(_url_part(str(vision.outside / "red.png"))),
            "messages[0].content[0]",
            "outside allowed_local_media_path",
        ),
        (
            "missing-file",
            _chat(_url_part(str(vision.media / "nope.png"))),
            "messages[0].content[0]",
            "no such file",
        ),
        (
            "image-in-system-message",
            [{"role": "system", "content": [red]}, *_chat()],
            "messages[0].content[0]",
            "cannot hold an image",
        ),
    ]


@pytest.mark.parametrize("case", range(8))
def test_bad_images_are_typed_errors_and_the_engine_keeps_serving(
    vision: Vision, case: int
) -> None:
    name, messages, parameter, fragment = _bad_requests(vision)[case]
    started = time.monotonic()
    with pytest.raises(BadRequestError) as e:
        list(vision.engine.stream(messages, max_tokens=MAX_TOKENS, temperature=0))
    assert time.monotonic() - started < 5, name  # no network wait, whatever the URL
    assert e.value.parameter == parameter, name
    assert fragment in str(e.value), name
    assert vision.engine.num_unfinished_requests() == 0
    deltas = list(
        vision.engine.stream(
            _chat(_url_part(_data_url(_png("red")))), max_tokens=MAX_TOKENS, temperature=0
        )
    )
    assert _ids(deltas) == vision.reference["red"]


def test_an_image_sent_to_a_text_only_model_is_a_typed_error(scripted: Any) -> None:
    s = scripted("chatml")
    with pytest.raises(BadRequestError) as e:
        list(s.engine.stream(_chat(_url_part(_data_url(_png("red"))))))
    assert e.value.parameter == "messages[0].content[0]"
    assert "text-only" in str(e.value)
    answer = "".join(d.text for d in s.engine.stream([{"role": "user", "content": "hi"}]))
    assert answer == s.scenario.answer


# -- LangChain ------------------------------------------------------------------------------


def _reference_text(vision: Vision, color: str) -> str:
    deltas = vision.engine.stream(
        _chat(_url_part(_data_url(_png(color)))), max_tokens=MAX_TOKENS, temperature=0
    )
    return "".join(d.text for d in deltas)


@pytest.mark.parametrize(
    "block",
    [
        lambda png: {
            "type": "image",
            "base64": base64.b64encode(png).decode(),
            "mime_type": "image/png",
        },
        lambda png: {"type": "image", "url": _data_url(png)},
        lambda png: {"type": "image_url", "image_url": {"url": _data_url(png)}},
    ],
    ids=["base64", "url", "openai"],
)
def test_chatvllm_streams_an_answer_about_an_image(vision: Vision, block: Any) -> None:
    llm = ChatVLLM(
        model=vision.path, vllm_kwargs=vision.vllm_kwargs, max_tokens=MAX_TOKENS, temperature=0
    )
    message = HumanMessage([block(_png("blue")), {"type": "text", "text": QUESTION}])
    chunks = list(llm.stream([message]))
    assert len(chunks) > 1
    full = chunks[0]
    for chunk in chunks[1:]:
        full += chunk
    assert full.content == _reference_text(vision, "blue")
    assert full.usage_metadata["input_tokens"] == vision.prompt_tokens["blue"]


def test_chatvllm_async_local_file_image(vision: Vision) -> None:
    llm = ChatVLLM(
        model=vision.path, vllm_kwargs=vision.vllm_kwargs, max_tokens=MAX_TOKENS, temperature=0
    )
    message = HumanMessage(
        [
            {"type": "image", "url": str(vision.media / "red.png")},
            {"type": "text", "text": QUESTION},
        ]
    )
    answer = asyncio.run(llm.ainvoke([message]))
    assert answer.content == _reference_text(vision, "red")


# -- the server's /v1/responses ----------------------------------------------------------------


def test_responses_input_image_gets_the_engines_answer_about_that_image(vision: Vision) -> None:
    """An ``input_image`` part of a Responses message reaches the engine as the image it is:
    each colour's answer is the engine's own for that image, with its image tokens counted."""
    from fastapi import FastAPI
    from serving import serving

    from vllm_inline.server import OpenAIServer
    from vllm_inline.server.responses import MemoryResponseStore

    server = OpenAIServer(chat={"vision": vision.engine}, responses_store=MemoryResponseStore())
    app = FastAPI(lifespan=server.lifespan)
    server.install(app)
    with serving(app) as url:
        for color in ("red", "blue"):
            content = [
                {"type": "input_image", "image_url": _data_url(_png(color))},
                {"type": "input_text", "text": QUESTION},
            ]
            body = {"model": "vision", "max_output_tokens": MAX_TOKENS, "temperature": 0,
                    "input": [{"type": "message", "role": "user", "content": content}]}  # fmt: skip
            answer = httpx.post(f"{url}/v1/responses", json=body, timeout=120).json()
            (message,) = answer["output"]
            assert message["content"][0]["text"] == _reference_text(vision, color), color
            assert answer["usage"]["input_tokens"] == vision.prompt_tokens[color], color


# -- LlamaIndex -----------------------------------------------------------------------------


def vllm_engine(vision: Vision) -> VLLM:
    return VLLM(
        model=vision.path, vllm_kwargs=vision.vllm_kwargs, max_tokens=MAX_TOKENS, temperature=0
    )


def _image_message(block: ImageBlock) -> list[ChatMessage]:
    return [ChatMessage(role="user", blocks=[block, TextBlock(text=QUESTION)])]


def test_llama_index_stream_chat_and_chat_with_image_blocks(vision: Vision) -> None:
    llm = vllm_engine(vision)
    assert llm.metadata.is_multimodal
    red = _reference_text(vision, "red")
    responses = list(llm.stream_chat(_image_message(ImageBlock(image=_png("red")))))
    assert len(responses) > 1 and responses[-1].message.content == red
    by_path = llm.chat(_image_message(ImageBlock(path=vision.media / "red.png")))
    assert by_path.message.content == red
    by_url = llm.chat(_image_message(ImageBlock(url=_data_url(_png("blue")))))
    assert by_url.message.content == _reference_text(vision, "blue") != red


def test_llama_index_async_image_blocks(vision: Vision) -> None:
    llm = vllm_engine(vision)

    async def run() -> tuple[str, str]:
        answer = await llm.achat(_image_message(ImageBlock(image=_png("blue"))))
        last = None
        async for response in await llm.astream_chat(_image_message(ImageBlock(image=_png("red")))):
            last = response
        assert last is not None
        return answer.message.content, last.message.content

    blue, red = asyncio.run(run())
    assert blue == _reference_text(vision, "blue")
    assert red == _reference_text(vision, "red")


def test_llama_index_refuses_a_remote_image_url(vision: Vision) -> None:
    with pytest.raises(BadRequestError) as e:
        vllm_engine(vision).chat(_image_message(ImageBlock(url="https://example.com/cat.png")))
    assert e.value.parameter == "messages[0].content[0]"


def test_an_allowed_remote_url_that_cannot_be_fetched_is_a_typed_error(vision: Vision) -> None:
    """With the domain allowed (the module's engine allows 127.0.0.1), vLLM fetches the URL; a
    fetch that fails (here: nothing listens on the port, and vLLM retries twice, 1 s and 4 s
    apart) is a typed error, and the engine keeps serving."""
    started = time.monotonic()
    with pytest.raises(BadRequestError) as e:
        list(
            vision.engine.stream(
                _chat(_url_part("http://127.0.0.1:9/cat.png")), max_tokens=MAX_TOKENS
            )
        )
    assert time.monotonic() - started < 15
    assert e.value.parameter == "messages"
    assert "could not take the images" in str(e.value)
    assert vision.engine.num_unfinished_requests() == 0
    deltas = list(
        vision.engine.stream(
            _chat(_url_part(_data_url(_png("red")))), max_tokens=MAX_TOKENS, temperature=0
        )
    )
    assert _ids(deltas) == vision.reference["red"]
