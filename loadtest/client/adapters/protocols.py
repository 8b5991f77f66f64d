"""What an API adapter is (``ApiAdapter``), and what one with its own transport is (``SelfSending``).

Protocols, in a module the compiled build leaves as Python: ``SelfSending`` is checked at run time."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:
    from loadtest.client.http import Endpoint, Response
    from loadtest.client.openai import OpenAIClient, PreparedRequest
    from loadtest.client.record import RequestRecord


class ApiAdapter(Protocol):
    """One API the client speaks: where its requests go, their body, and how its answers are read.

    ``OpenAIClient`` sends every request through the adapter registered under the request's ``api``
    (client/adapters/registry.py): it adds the headers, sends, applies ``classify_http`` to every
    answer, hands a 2xx answer to ``classify`` and redacts the error text."""

    names: ClassVar[tuple[str, ...]]  # the profile's ``api`` values it serves
    accept: ClassVar[
        str | None
    ]  # the Accept header its requests carry instead of the client's (None: the client's)
    capped_by_tokens: ClassVar[
        bool
    ]  # its answers grow with max tokens (the size cap follows them); else 64 MiB
    # headers its requests carry unless the profile's request.headers name them (Messages: anthropic-version)
    default_headers: ClassVar[tuple[tuple[str, str], ...]]

    def path(self, endpoint: Endpoint, req: PreparedRequest) -> str:
        """The request target: ``Endpoint.api_path`` of its route where the API has one (the host's
        fixed path or the route under its API prefix, with the host's query string)."""
        ...

    def streams(self, req: PreparedRequest) -> bool:
        """Whether the request asks for a streamed answer."""
        ...

    def body(self, client: OpenAIClient, req: PreparedRequest) -> bytes:
        """The request body: ``req.body`` with the client's model, the profile's extra fields, stream flags."""
        ...

    def classify(
        self, client: OpenAIClient, rec: RequestRecord, req: PreparedRequest, resp: Response
    ) -> None:
        """Read a 2xx answer (status, redirects and content coding already checked) into ``rec``: outcome,
        error, times, token counts, finish reason, text."""
        ...


@runtime_checkable
class SelfSending(Protocol):
    """An adapter with its own transport (gRPC): ``OpenAIClient.send`` hands it the request and the record,
    set up, instead of sending HTTP; it sets the times, the outcome and the error, and never raises for
    what a server does."""

    def exchange(self, client: OpenAIClient, rec: RequestRecord, req: PreparedRequest) -> None: ...
