"""Deterministic synthetic PNG images as OpenAI ``image_url`` content parts (no imaging library)."""

from __future__ import annotations

import base64
import random
import struct
import zlib
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_TILE = 16  # a random tile repeated over the image: distinct per image, yet compresses to a few KB


def _chunk(kind: bytes, data: bytes) -> bytes:
    """One PNG chunk: length, type, data, CRC of type and data."""
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


@lru_cache(maxsize=64)
def png_bytes(seed: int, index: int, width: int, height: int) -> bytes:
    """An 8-bit RGB PNG of ``width`` × ``height`` whose pixels follow from (seed, index)."""
    if width < 1 or height < 1:
        raise ValueError("image width and height must be ≥ 1")
    rng = random.Random(f"{seed}:image:{index}")
    tile = [rng.randbytes(3 * _TILE) for _ in range(_TILE)]
    reps = -(-width // _TILE)
    rows = [b"\x00" + (tile[y % _TILE] * reps)[: 3 * width] for y in range(height)]
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"".join(rows), 6)
    return PNG_SIGNATURE + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def image_part(seed: int, index: int, width: int, height: int, detail: str = "auto") -> dict[str, Any]:
    """An OpenAI ``image_url`` content part carrying the PNG as a base64 data URL."""
    data = base64.b64encode(png_bytes(seed, index, width, height)).decode("ascii")
    return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}", "detail": detail}}


def user_content(text: str, images: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """A user message's content parts: the text, then the images."""
    return [{"type": "text", "text": text}, *images]
