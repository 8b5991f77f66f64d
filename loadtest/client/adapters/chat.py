"""The chat completions API (``api: chat``, POST /v1/chat/completions): messages in, the ``choices`` shape
out, as SSE chunks or one chat.completion object. The completions API and raw replay read the same shape."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from mypy_extensions import mypyc_attr

from loadtest.client.adapters.base import RoutedAdapter, json_encoder, openai_body
from loadtest.client.choices import classify_choices_object, classify_choices_stream

if TYPE_CHECKING:
    from loadtest.client.http import Response
    from loadtest.client.openai import OpenAIClient, PreparedRequest
    from loadtest.client.record import RequestRecord


@mypyc_attr(allow_interpreted_subclasses=True)  # the completions API subclasses it
class ChatAdapter(RoutedAdapter):
    """Chat completions; ``route`` is the path under the endpoint's API prefix."""

    names: ClassVar[tuple[str, ...]] = ("chat",)
    route: ClassVar[str] = "/chat/completions"

    def body(self, client: OpenAIClient, req: PreparedRequest) -> bytes:
        body = openai_body(client, req)
        if self.streams(req):
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return json_encoder.encode(body)

    def classify(
        self, client: OpenAIClient, rec: RequestRecord, req: PreparedRequest, resp: Response
    ) -> None:
        if self.streams(req):
            classify_choices_stream(client, rec, resp)
        else:
            classify_choices_object(client, rec, resp)
