"""Images in chat messages: the forms a content part may take, and the checks before rendering.

An image reaches vLLM's renderer, which runs the model's own processor and expands the model's
placeholder tokens (so ``usage.prompt_tokens`` counts the image tokens). Before that, every image
part is checked here in two steps, so that bad input fails with a typed error naming
``messages[i].content[j]`` instead of an exception from deep inside vLLM:

1. :func:`normalize_image_part` and :func:`check_sources` (no engine needed, from
   :func:`.messages.validate_messages` with the engine's options): the form is known, a data URL
   has a supported image MIME type and valid base64 that decodes to an image, raw bytes decode to
   an image, a local file is inside ``allowed_local_media_path``, and a remote ``http(s)`` URL
   is refused unless its domain is in ``allowed_media_domains`` (then vLLM fetches it, with its
   own timeout and retries: ``VLLM_IMAGE_FETCH_TIMEOUT``, ``VLLM_MEDIA_FETCH_MAX_RETRIES``).
2. :func:`check_images` (once the engine is up, in :mod:`.render`): the model takes images and
   the count is within ``limit_mm_per_prompt`` (and the sources again, as the engine sees them).

Accepted parts (in the ``content`` list of a ``user`` or ``tool`` message):

- OpenAI's ``{"type": "image_url", "image_url": {"url": ...}}`` (or ``"image_url": "<url>"``),
  where the URL is a ``data:image/...;base64,`` URL, a ``file://`` URL or an absolute local path,
  or an ``http(s)`` URL of an allowed domain;
- ``{"type": "image", "image": ...}`` holding any of the below or a URL;
- raw image ``bytes`` (PNG, JPEG, ...), a ``PIL.Image.Image``, or vLLM's
  ``{"type": "image_pil", "image_pil": <PIL image>}``.

Bytes and data URLs are decoded here once and handed to vLLM as PIL images; URLs of files go to
vLLM as ``file://`` URLs, which it loads itself (and checks against the same directory).
"""

from __future__ import annotations

import base64
import binascii
import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from vllm_inline.engine.errors import BadRequestError
from vllm_inline.engine.life.runtime import MediaPolicy

__all__ = [
    "IMAGE_MIME_TYPES",
    "ImageRef",
    "check_images",
    "check_sources",
    "is_image_part",
    "normalize_image_part",
    "text_view",
]

IMAGE_MIME_TYPES = ("image/png", "image/jpeg", "image/jpg", "image/gif", "image/webp", "image/bmp")
"""MIME types a ``data:`` URL may carry (the formats Pillow decodes without extra plugins)."""

_IMAGE_TYPES = ("image_url", "image", "image_pil", "input_image")


@dataclass(frozen=True)
class ImageRef:
    """Where an image is in the messages and what kind of source it is, for the engine checks."""

    where: str
    """``messages[i].content[j]``."""
    source: str
    """``"inline"`` (decoded already), ``"file"`` (a local path) or ``"remote"`` (http/https)."""
    location: str | None = None
    """The resolved local path, or the remote URL."""


def _pil() -> Any:
    from PIL import Image

    return Image


def is_image_part(part: Any) -> bool:
    """True for a content part this module handles (checked without importing Pillow eagerly)."""
    if isinstance(part, (bytes, bytearray, memoryview)):
        return True
    if isinstance(part, Mapping):
        return part.get("type") in _IMAGE_TYPES
    return type(part).__module__.startswith("PIL.")


def _decode_image(data: bytes, where: str, shown: Any) -> Any:
    Image = _pil()
    try:
        image = Image.open(io.BytesIO(data))
        image.load()  # a truncated or corrupt file fails here, not inside the engine
    except Exception as e:
        raise BadRequestError.invalid(
            where,
            shown,
            f"the bytes are not a readable image ({type(e).__name__}: {e}); send "
            f"PNG, JPEG, GIF, WebP or BMP data",
        ) from e
    return image


def _from_data_url(url: str, where: str) -> Any:
    header, sep, data = url[5:].partition(",")
    media_type, _, encoding = header.rpartition(";")
    if not sep or encoding.lower() != "base64":
        raise BadRequestError.invalid(
            where, url, "a data URL must be base64: 'data:image/png;base64,<data>'"
        )
    mime = media_type.partition(";")[0].strip().lower()
    if mime not in IMAGE_MIME_TYPES:
        raise BadRequestError.invalid(
            where,
            url,
            f"MIME type {mime or '(none)'!r} is not a supported image type; "
            f"use one of {', '.join(IMAGE_MIME_TYPES)} (PDF, audio and video are not supported)",
        )
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise BadRequestError.invalid(where, url, f"the base64 data is corrupt ({e})") from e
    return _decode_image(raw, where, url)


def _from_url(url: str, where: str) -> tuple[dict[str, Any], ImageRef]:
    if url[:5].lower() == "data:":
        image = _from_data_url(url, where)
        return {"type": "image_pil", "image_pil": image}, ImageRef(where, "inline")
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme in ("http", "https"):
        return {"type": "image_url", "image_url": {"url": url}}, ImageRef(where, "remote", url)
    if scheme == "file":
        path = unquote(parsed.netloc + parsed.path)
    elif scheme == "" or (len(scheme) == 1 and os.name == "nt"):
        path = os.path.expanduser(url)
    else:
        raise BadRequestError.invalid(
            where,
            url,
            "an image URL must be a data: URL, a file:// URL or local path, or an "
            "http(s) URL of a domain in allowed_media_domains",
        )
    if not os.path.isabs(path):
        raise BadRequestError.invalid(where, url, "a local image path must be absolute")
    resolved = os.path.realpath(path)
    return {"type": "image_url", "image_url": {"url": "file://" + resolved}}, ImageRef(
        where, "file", resolved
    )


def normalize_image_part(part: Any, where: str) -> tuple[dict[str, Any], ImageRef]:
    """The part vLLM's renderer gets for image ``part``, and where it comes from.

    Raises :class:`BadRequestError` (``parameter=where``) for a form or payload that cannot be
    an image, before any engine work.
    """
    if isinstance(part, (bytes, bytearray, memoryview)):
        image = _decode_image(bytes(part), where, f"<{len(part)} bytes>")
        return {"type": "image_pil", "image_pil": image}, ImageRef(where, "inline")
    if not isinstance(part, Mapping):  # a PIL image (is_image_part said so)
        return {"type": "image_pil", "image_pil": part}, ImageRef(where, "inline")
    kind = part["type"]
    value = part.get(kind)
    if kind == "input_image":  # OpenAI's Responses form
        value = part.get("image_url")
    if isinstance(value, Mapping) and kind in ("image_url", "image"):
        value = value.get("url")
    if isinstance(value, str) and value:
        return _from_url(value, where)
    if isinstance(value, (bytes, bytearray, memoryview)) or (
        value is not None and type(value).__module__.startswith("PIL.")
    ):
        return normalize_image_part(value, where)
    raise BadRequestError.invalid(
        where,
        part,
        f"an image part of type {kind!r} needs its image: "
        "{'type': 'image_url', 'image_url': {'url': 'data:image/png;base64,...'}}, raw bytes or "
        "a PIL image",
    )


def check_images(refs: Sequence[ImageRef], policy: MediaPolicy, model: str) -> None:
    """Refuse images the running engine cannot take (see the module docstring, step 2)."""
    if not refs:
        return
    if not policy.multimodal:
        raise BadRequestError.invalid(
            refs[0].where,
            "<image>",
            f"{model!r} is a text-only model and cannot take images; "
            "send text only, or use a vision-language model (see docs/multimodal.md)",
        )
    if len(refs) > policy.image_limit:
        raise BadRequestError.invalid(
            refs[policy.image_limit].where,
            "<image>",
            f"this request has {len(refs)} images but the engine takes at most "
            f"{policy.image_limit} per prompt; send fewer, or start the engine with "
            f"vllm_kwargs={{'limit_mm_per_prompt': {{'image': {len(refs)}}}}}",
        )
    check_sources(refs, policy.allowed_local_media_path, policy.allowed_media_domains)


def check_sources(
    refs: Sequence[ImageRef], allowed_local_media_path: str, allowed_media_domains: Sequence[str]
) -> None:
    """Refuse a local file outside ``allowed_local_media_path`` and a remote URL whose domain
    is not in ``allowed_media_domains`` (the engine options of the same names)."""
    for ref in refs:
        if ref.source == "remote":
            host = urlparse(ref.location or "").hostname or ""
            if host not in allowed_media_domains:
                raise BadRequestError.invalid(
                    ref.where,
                    ref.location,
                    "remote image URLs are refused: the engine would "
                    "have to download the image (there may be no network, and a slow server "
                    "would stall the request). Send the image inline (a base64 data URL, bytes "
                    "or a PIL image), or allow the domain with vllm_kwargs="
                    "{'allowed_media_domains': [...]} (vLLM then fetches it, with its own "
                    "timeout and retries: see docs/multimodal.md)",
                )
        elif ref.source == "file":
            _check_local(ref, allowed_local_media_path)


def _check_local(ref: ImageRef, allowed: str) -> None:
    path = ref.location or ""
    if not allowed:
        raise BadRequestError.invalid(
            ref.where,
            path,
            "local image files are refused unless the engine allows a "
            "directory: start it with vllm_kwargs={'allowed_local_media_path': '/dir'}",
        )
    root = os.path.realpath(allowed)
    if os.path.commonpath([root, path]) != root:
        raise BadRequestError.invalid(
            ref.where,
            path,
            f"the file is outside allowed_local_media_path {root!r}; move it "
            "there or send the image inline",
        )
    if not os.path.isfile(path):
        raise BadRequestError.invalid(ref.where, path, "no such file")


def text_view(messages: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """``messages`` with image parts dropped and text joined: what output parsers need."""
    if not messages:
        return messages
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            text = "\n".join(p["text"] for p in content if p.get("type") == "text")
            message = {**message, "content": text}
        out.append(message)
    return out
