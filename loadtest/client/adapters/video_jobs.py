"""The OpenAI-style video job API (``api: video_jobs``): POST /v1/videos creates a job, GET /v1/videos/{id}
is polled every ``poll_interval_s`` until it is completed, GET /v1/videos/{id}/content downloads the
video. Latency is the create request's send to the content's last byte, in four recorded parts: submit,
queued, generating and download (``RequestRecord.job_us``; docs/sources.md §22)."""

from __future__ import annotations

from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, ClassVar

import gevent

from loadtest.client.adapters.base import (
    CAP_UNLIMITED_BYTES,
    RoutedAdapter,
    classify_http,
    done_time,
    json_encoder,
    json_object,
    obj_at,
    openai_body,
    text_at,
)
from loadtest.client.adapters.videogen import is_mp4
from loadtest.client.http import HttpFailure, Response, build_request
from loadtest.client.secrets import snippet

if TYPE_CHECKING:
    from loadtest.client.openai import OpenAIClient, PreparedRequest
    from loadtest.client.record import RequestRecord

DEFAULT_POLL_S = 1.0
MAX_WAIT_S = 3600.0  # how long a job may stay unfinished without a total timeout
STATUSES = frozenset({"queued", "in_progress", "completed", "failed"})


class VideoJobsAdapter(RoutedAdapter):
    names: ClassVar[tuple[str, ...]] = ("video_jobs",)
    route: ClassVar[str] = "/videos"
    accept: ClassVar[str | None] = "application/json"
    capped_by_tokens: ClassVar[bool] = False

    def streams(self, req: PreparedRequest) -> bool:
        return False

    def body(self, client: OpenAIClient, req: PreparedRequest) -> bytes:
        return json_encoder.encode(openai_body(client, req))  # the prompt, the model, the profile's fields

    def classify(
        self, client: OpenAIClient, rec: RequestRecord, req: PreparedRequest, resp: Response
    ) -> None:
        rec.inputs = 1
        rec.done_ns = done_time(resp)
        job = _job(rec, resp)
        if job is None:
            return
        job_id, status = job
        submitted = rec.done_ns
        started = completed = 0
        # the whole job, from the create's send: the total timeout, else MAX_WAIT_S
        deadline = (rec.sent_ns or perf_counter_ns()) + int((client.timeouts.total or MAX_WAIT_S) * 1e9)
        base = client.endpoint.api_path(f"{self.route}/{job_id}")
        while status != "completed":
            if status == "in_progress" and not started:
                started = rec.done_ns
            if perf_counter_ns() >= deadline:
                rec.outcome, rec.error = "timeout", f"job {job_id} still {status} when the wait ended"
                return
            gevent.sleep(req.poll_s or DEFAULT_POLL_S)
            poll = _get(client, rec, req, base, deadline)
            if poll is None or (job := _job(rec, poll)) is None:
                return
            status = job[1]
        completed = rec.done_ns
        started = started or submitted  # never seen queued or running between two polls: all generating
        content = _get(client, rec, req, base + "/content", deadline, accept="video/mp4, */*")
        if content is None:
            return
        if content.broken:
            rec.outcome, rec.error = content.broken_outcome, content.broken
            return
        if not is_mp4(content.body) and not (content.content_type.startswith("video/") and content.body):
            rec.outcome, rec.error = "protocol_error", f"the content is not a video: {snippet(content.body)}"
            return
        rec.job_us = [
            (submitted - rec.sent_ns) // 1000,
            (started - submitted) // 1000,
            (completed - started) // 1000,
            (rec.done_ns - completed) // 1000,
        ]
        rec.outcome, rec.finish_reason = "ok", "stop"


def _job(rec: RequestRecord, resp: Response) -> tuple[str, str] | None:
    """A job object's id and status; None (the outcome set) when the answer is not one or the job failed."""
    obj = json_object(rec, resp)
    if obj is None:
        return None
    job_id, status = text_at(obj, "id"), text_at(obj, "status")
    if not job_id or status not in STATUSES or "/" in job_id:
        rec.outcome, rec.error = "protocol_error", f"not a video job: {snippet(resp.body)}"
        return None
    if status == "failed":
        err = obj_at(obj, "error")
        rec.outcome = "stream_error"
        rec.error = f"job {job_id} failed: {text_at(err, 'message') or snippet(resp.body)}"
        return None
    return job_id, status


def _get(
    client: OpenAIClient,
    rec: RequestRecord,
    req: PreparedRequest,
    path: str,
    deadline: int,
    accept: str = "application/json",
) -> Response | None:
    """A GET of the job's ``path`` with the request's headers and wire id; None (the outcome set) when it
    failed or answered an error status."""
    headers: dict[str, Any] = client.request_headers(req, None)
    if client.request_id_header and rec.wire_id:
        headers[client.request_id_header] = rec.wire_id
    headers["Accept"] = accept
    headers.pop("Content-Type", None)
    raw = build_request(client.endpoint, "GET", path, b"", headers)
    try:
        resp = client.conn.request(raw, client.timeouts.read, deadline, None, CAP_UNLIMITED_BYTES)
    except HttpFailure as f:
        rec.outcome, rec.error = f.outcome, f.message
        return None
    rec.done_ns = done_time(resp)
    if classify_http(rec, resp):
        return None
    return resp
