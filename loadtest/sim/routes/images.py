"""POST /v1/images/generations (the OpenAI shape): a prompt, ``n``, ``size`` and ``response_format`` in,
``n`` images out as base64 or URLs; served as one timed pass whose time grows with the images' pixels
(docs/sources.md §23)."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from loadtest.sim.protocol import OutputPlan, RequestError
from loadtest.sim.routes.base import Answer, ComputeRequest, EngineRequest, Flow, StreamWriter
from loadtest.sim.routes.videogen import parse_size
from loadtest.tokens.tokenizer import Tokenizer

IMAGES_PATH = "/v1/images/generations"
# The cost model (our estimate): a 1024x1024 image in 2 s on the modelled device, linear in pixels.
IMAGE_S = 2.0
MAX_IMAGES = 10
# The smallest PNG: its 8-byte signature and an empty IEND chunk, what the answers carry.
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\x00IEND\xaeB`\x82"


@dataclass(frozen=True)
class ImageRequest(ComputeRequest):
    as_url: bool


def parse_image_request(body: dict[str, Any]) -> ImageRequest:
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise RequestError(
            400, "'prompt' is required: a non-empty string", "missing_required_parameter", "prompt"
        )
    n = body.get("n", 1)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_IMAGES:
        raise RequestError(400, f"'n' must be an integer from 1 to {MAX_IMAGES}", "invalid_value", "n")
    width, height = parse_size(body.get("size", "1024x1024"))
    fmt = body.get("response_format", "b64_json")
    if fmt not in ("b64_json", "url"):
        raise RequestError(400, "'response_format' is b64_json or url", "invalid_value", "response_format")
    model = body.get("model")
    seconds = IMAGE_S * n * width * height / (1024 * 1024)
    return ImageRequest(n, seconds, model if isinstance(model, str) else None, fmt == "url")


class ImagesRoute:
    api = "images"
    path = IMAGES_PATH
    id_prefix = "img-"
    flow: Flow = "compute"

    def parse(self, body: dict[str, Any], tok: Tokenizer) -> ImageRequest:
        return parse_image_request(body)

    def writer(
        self, response_id: str, created: int, model: str, plan: OutputPlan, prompt_tokens: int
    ) -> StreamWriter:
        raise NotImplementedError("images are never streamed")

    def whole(self, req: EngineRequest, answer: Answer) -> dict[str, Any]:
        assert isinstance(req, ImageRequest)
        if req.as_url:
            data = [{"url": f"/sim/images/{answer.response_id}-{k}.png"} for k in range(req.samples)]
        else:
            data = [{"b64_json": base64.b64encode(PNG).decode()} for _ in range(req.samples)]
        return {"created": answer.created, "data": data}
