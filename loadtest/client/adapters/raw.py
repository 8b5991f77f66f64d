"""Raw replay (``api: raw``): each recorded body is sent to ``raw.path`` byte for byte, and its answer is read
as the API of that path answers (Responses, Messages, embeddings, else the chat/completions ``choices`` shape)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from loadtest.client.adapters.base import done_time, json_decoder
from loadtest.client.adapters.chat import ChatAdapter
from loadtest.client.adapters.embeddings import EmbeddingsAdapter
from loadtest.client.adapters.messages import MessagesAdapter
from loadtest.client.adapters.responses import ResponsesAdapter
from loadtest.client.http import Endpoint, Response

if TYPE_CHECKING:
    from loadtest.client.openai import OpenAIClient, PreparedRequest
    from loadtest.client.record import RequestRecord

DEFAULT_PATH = "/v1/chat/completions"
_CHAT = ChatAdapter()
_RESPONSES = ResponsesAdapter()
_EMBEDDINGS = EmbeddingsAdapter()
_MESSAGES = MessagesAdapter()


class RawAdapter:
    names: ClassVar[tuple[str, ...]] = ("raw",)
    accept: ClassVar[str | None] = None
    capped_by_tokens: ClassVar[bool] = True
    default_headers: ClassVar[tuple[tuple[str, str], ...]] = ()

    def path(self, endpoint: Endpoint, req: PreparedRequest) -> str:
        path = req.path or DEFAULT_PATH  # from the host's root, as recorded
        if endpoint.query:  # the host's query string is kept, after the recorded path's own
            path += ("&" if "?" in path else "?") + endpoint.query[1:]
        return path

    def streams(self, req: PreparedRequest) -> bool:
        return req.stream  # the recorded body's own ``stream``

    def body(self, client: OpenAIClient, req: PreparedRequest) -> bytes:
        return req.body["raw"].encode()  # no model, stream or extra field added

    def classify(
        self, client: OpenAIClient, rec: RequestRecord, req: PreparedRequest, resp: Response
    ) -> None:
        path = (req.path or "").rstrip("/")
        if path.endswith(_EMBEDDINGS.route):
            rec.done_ns = done_time(resp)
            _EMBEDDINGS.read_list(rec, resp, json_decoder.decode(req.body["raw"]).get("input"))
        elif path.endswith(_RESPONSES.route):
            _RESPONSES.classify(client, rec, req, resp)
        elif path.endswith(_MESSAGES.route):
            _MESSAGES.classify(client, rec, req, resp)  # the recorded body's own ``stream`` decides
        else:
            _CHAT.classify(client, rec, req, resp)
