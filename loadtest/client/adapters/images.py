"""Image generation (``api: images``, POST /v1/images/generations, the OpenAI shape): a prompt in, ``n``
images out, each as base64 (``b64_json``) or a URL; latency is end to end (docs/sources.md §23)."""

from __future__ import annotations

import binascii
from typing import TYPE_CHECKING, Any, ClassVar

from loadtest.client.adapters.base import JsonAdapter, done_time, json_object, list_at, text_at
from loadtest.client.http import Response
from loadtest.client.secrets import snippet

if TYPE_CHECKING:
    from loadtest.client.openai import OpenAIClient, PreparedRequest
    from loadtest.client.record import RequestRecord


def images_asked(client: OpenAIClient, req: PreparedRequest) -> int:
    """The ``n`` a request asks for (its body's, else the profile's extra body's, else 1)."""
    extra = client.extra_body
    n = req.body.get("n", extra.get("n", 1))
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1


class ImagesAdapter(JsonAdapter):
    names: ClassVar[tuple[str, ...]] = ("images",)
    route: ClassVar[str] = "/images/generations"

    def classify(
        self, client: OpenAIClient, rec: RequestRecord, req: PreparedRequest, resp: Response
    ) -> None:
        rec.done_ns = done_time(resp)
        rec.inputs = images_asked(client, req)
        read_images(rec, resp, rec.inputs)


def _image_problem(item: Any) -> str | None:
    """Why ``item`` is not one generated image (base64 that decodes, or a URL), or None."""
    b64, url = text_at(item, "b64_json"), text_at(item, "url")
    if url:
        return None
    if not b64:
        return "an image with neither b64_json nor url"
    try:
        if binascii.a2b_base64(b64.encode("ascii", "replace")):
            return None
    except (binascii.Error, ValueError):
        pass
    return "b64_json is not base64 of an image"


def read_images(rec: RequestRecord, resp: Response, n: int) -> None:
    """An images answer for a request of ``n`` images: ``data``, one entry each."""
    obj = json_object(rec, resp)
    if obj is None:
        return
    data = list_at(obj, "data")
    if len(data) != n:
        rec.outcome, rec.error = "protocol_error", f"{len(data)} image(s) for {n} asked: {snippet(resp.body)}"
        return
    for item in data:
        if problem := _image_problem(item):
            rec.outcome, rec.error = "protocol_error", problem
            return
    rec.outcome, rec.finish_reason = "ok", "stop"
