"""Video generation, the MLPerf Endpoints reference client's ``videogen`` shape (``api: videogen``, POST
/v1/videos/generations as trtllm-serve serves it): a prompt in, the finished video's path, its base64 bytes
or the MP4 itself out, in one answer; latency is end to end (docs/sources.md §22)."""

from __future__ import annotations

import binascii
from typing import TYPE_CHECKING, ClassVar

from loadtest.client.adapters.base import JsonAdapter, done_time, json_encoder, json_object, text_at
from loadtest.client.apis import extra_body
from loadtest.client.http import Response

if TYPE_CHECKING:
    from loadtest.client.openai import OpenAIClient, PreparedRequest
    from loadtest.client.record import RequestRecord


def is_mp4(body: bytes) -> bool:
    """An ISO BMFF file: its first box is ``ftyp`` (bytes 4-8)."""
    return len(body) >= 8 and body[4:8] == b"ftyp"


class VideoGenAdapter(JsonAdapter):
    names: ClassVar[tuple[str, ...]] = ("videogen",)
    route: ClassVar[str] = "/videos/generations"
    accept: ClassVar[str | None] = "application/json, video/mp4"

    def body(self, client: OpenAIClient, req: PreparedRequest) -> bytes:
        body = dict(req.body)
        extra_body(client, body)  # the profile's generation fields (num_frames, size, response_format ...)
        return json_encoder.encode(body)  # the reference client sends no model

    def classify(
        self, client: OpenAIClient, rec: RequestRecord, req: PreparedRequest, resp: Response
    ) -> None:
        rec.done_ns = done_time(resp)
        rec.inputs = 1
        read_video(rec, resp)


def read_video(rec: RequestRecord, resp: Response) -> None:
    """A finished video: the MP4 itself, or ``{video_id, video_path}`` / ``{video_id, video_bytes}``."""
    if not resp.broken and is_mp4(resp.body):
        rec.outcome, rec.finish_reason = "ok", "stop"
        return
    obj = json_object(rec, resp)
    if obj is None:
        return
    video_id, path, b64 = text_at(obj, "video_id"), text_at(obj, "video_path"), text_at(obj, "video_bytes")
    if not video_id or not (path or b64):
        rec.outcome = "protocol_error"
        rec.error = "not a video answer: no video_id with a video_path or video_bytes"
        return
    if b64:
        try:
            data = binascii.a2b_base64(b64.encode("ascii", "replace"))
        except (binascii.Error, ValueError):
            data = b""
        if not data:
            rec.outcome, rec.error = "protocol_error", "video_bytes is not base64 of a video"
            return
    rec.outcome, rec.finish_reason = "ok", "stop"
