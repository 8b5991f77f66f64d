"""POST /v1/videos (the OpenAI-style video job API): a prompt in, a job at once; GET /v1/videos/{id} polls
it (queued, in_progress, completed), GET /v1/videos/{id}/content downloads the MP4. The generation runs
in the background on the engine's device for the video cost model's time (sim/routes/videogen.py,
docs/sources.md §22)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loadtest.sim.protocol import OutputPlan, RequestError
from loadtest.sim.routes.base import Answer, ComputeRequest, EngineRequest, Flow, Job, StreamWriter
from loadtest.sim.routes.videogen import HEIGHT, STEPS, WIDTH, fake_mp4, generation_s, parse_size
from loadtest.tokens.tokenizer import Tokenizer

VIDEOS_PATH = "/v1/videos"
FPS = 16  # frames a second of video: seconds × FPS + 1 frames (81 for MLPerf's 5 s)


@dataclass(frozen=True)
class VideoJobRequest(ComputeRequest):
    seconds_of_video: str
    size: str


def parse_job_request(body: dict[str, Any]) -> VideoJobRequest:
    """The job's prompt, length (``seconds``, a string or a number) and ``size``."""
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise RequestError(
            400, "'prompt' is required: a non-empty string", "missing_required_parameter", "prompt"
        )
    secs = body.get("seconds", "5")
    try:
        n = float(secs) if isinstance(secs, (str, int, float)) and not isinstance(secs, bool) else -1.0
    except ValueError:
        n = -1.0
    if not 0 < n <= 60:
        raise RequestError(
            400, "'seconds' must be a number of seconds from 1 to 60", "invalid_value", "seconds"
        )
    size = body.get("size", f"{WIDTH}x{HEIGHT}")
    width, height = parse_size(size)
    model = body.get("model")
    cost = generation_s(int(n * FPS) + 1, STEPS, width, height)
    return VideoJobRequest(1, cost, model if isinstance(model, str) else None, str(secs), str(size))


class VideoJobsRoute:
    api = "video_jobs"
    path = VIDEOS_PATH
    id_prefix = "video_"
    flow: Flow = "job"

    def parse(self, body: dict[str, Any], tok: Tokenizer) -> VideoJobRequest:
        return parse_job_request(body)

    def writer(
        self, response_id: str, created: int, model: str, plan: OutputPlan, prompt_tokens: int
    ) -> StreamWriter:
        raise NotImplementedError("video jobs are never streamed")

    def whole(self, req: EngineRequest, answer: Answer) -> dict[str, Any]:
        raise NotImplementedError("a video job answers with the job (job_body)")

    def job_body(self, job: Job) -> dict[str, Any]:
        req = job.request
        assert isinstance(req, VideoJobRequest)
        progress = {"queued": 0, "in_progress": 50, "completed": 100}.get(job.status, 0)
        return {
            "id": job.id,
            "object": "video",
            "model": job.model,
            "status": job.status,
            "progress": progress,
            "created_at": job.created,
            "completed_at": job.completed_at,
            "seconds": req.seconds_of_video,
            "size": req.size,
        }

    def job_content(self, job: Job) -> tuple[bytes, str]:
        return fake_mp4(job.id), "video/mp4"
