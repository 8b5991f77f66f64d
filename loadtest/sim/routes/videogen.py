"""POST /v1/videos/generations (the reference client's ``videogen`` shape, as trtllm-serve serves it): a
prompt and generation fields in, the finished video out (its path, or its base64 bytes with
``response_format: video_bytes``); served as one timed pass whose time grows with frames × steps × pixels
(docs/sources.md §22)."""

from __future__ import annotations

import base64
import re
import struct
from dataclasses import dataclass
from typing import Any

from loadtest.sim.protocol import OutputPlan, RequestError
from loadtest.sim.routes.base import Answer, ComputeRequest, EngineRequest, Flow, StreamWriter
from loadtest.tokens.tokenizer import Tokenizer

VIDEOGEN_PATH = "/v1/videos/generations"
# MLPerf's Wan 2.2 shape (the reference client's defaults) and its single-stream time on one system.
FRAMES, STEPS, WIDTH, HEIGHT = 81, 20, 720, 1280
REFERENCE_S = 21.0
_SIZE = re.compile(r"^(\d{2,5})x(\d{2,5})$")


@dataclass(frozen=True)
class VideoRequest(ComputeRequest):
    frames: int
    steps: int
    size: str
    as_bytes: bool


def generation_s(frames: int, steps: int, width: int, height: int) -> float:
    """The cost model: the reference time scaled by frames × steps × pixels against MLPerf's shape."""
    return REFERENCE_S * (frames * steps * width * height) / (FRAMES * STEPS * WIDTH * HEIGHT)


def parse_size(size: Any) -> tuple[int, int]:
    """A ``WxH`` frame size; RequestError (400) otherwise."""
    m = _SIZE.match(size) if isinstance(size, str) else None
    if m is None:
        raise RequestError(400, "'size' must be 'WxH', e.g. 720x1280", "invalid_value", "size")
    return int(m.group(1)), int(m.group(2))


def _count(body: dict[str, Any], key: str, default: int, most: int) -> int:
    v = body.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= most:
        raise RequestError(400, f"'{key}' must be an integer from 1 to {most}", "invalid_value", key)
    return v


def parse_video_request(body: dict[str, Any]) -> VideoRequest:
    """A generation request's fields (the reference client's defaults for those it leaves out)."""
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise RequestError(
            400, "'prompt' is required: a non-empty string", "missing_required_parameter", "prompt"
        )
    frames = _count(body, "num_frames", FRAMES, 1000)
    steps = _count(body, "num_inference_steps", STEPS, 1000)
    width, height = parse_size(body.get("size", f"{WIDTH}x{HEIGHT}"))
    size = f"{width}x{height}"
    fmt = body.get("response_format", "video_path")
    if fmt not in ("video_path", "video_bytes"):
        raise RequestError(
            400, "'response_format' is video_path or video_bytes", "invalid_value", "response_format"
        )
    model = body.get("model")
    seconds = generation_s(frames, steps, width, height)
    return VideoRequest(
        1, seconds, model if isinstance(model, str) else None, frames, steps, size, fmt == "video_bytes"
    )


def fake_mp4(video_id: str) -> bytes:
    """A few bytes that start as an MP4 does (an ``ftyp`` box), then the video's id."""
    return struct.pack(">I", 16) + b"ftypisom" + b"\0\0\2\0" + video_id.encode()


class VideoGenRoute:
    api = "videogen"
    path = VIDEOGEN_PATH
    id_prefix = "video_"
    flow: Flow = "compute"

    def parse(self, body: dict[str, Any], tok: Tokenizer) -> VideoRequest:
        return parse_video_request(body)

    def writer(
        self, response_id: str, created: int, model: str, plan: OutputPlan, prompt_tokens: int
    ) -> StreamWriter:
        raise NotImplementedError("videos are never streamed")

    def whole(self, req: EngineRequest, answer: Answer) -> dict[str, Any]:
        assert isinstance(req, VideoRequest)
        vid = answer.response_id
        if req.as_bytes:
            return {"video_id": vid, "video_bytes": base64.b64encode(fake_mp4(vid)).decode()}
        return {"video_id": vid, "video_path": f"/sim/videos/{vid}.mp4"}
