"""The APIs the embedded engine serves: one route per API (``ApiRoute``, sim/routes/base.py), registered
once here; server.py adds each to the app and serves it with its flow. Adding an API is one route module
and one line in ``_BUILTIN`` (docs/api-surface.md, "Adding an API")."""

from __future__ import annotations

from loadtest.sim.routes.base import Answer, ApiRoute, PrefillRequest, StreamWriter
from loadtest.sim.routes.chat import ChatRoute
from loadtest.sim.routes.completions import CompletionsRoute
from loadtest.sim.routes.embeddings import EmbeddingsRoute
from loadtest.sim.routes.images import ImagesRoute
from loadtest.sim.routes.kserve_v2 import KServeV2Route
from loadtest.sim.routes.messages import MessagesRoute
from loadtest.sim.routes.rerank import RerankRoute
from loadtest.sim.routes.responses import ResponsesRoute
from loadtest.sim.routes.video_jobs import VideoJobsRoute
from loadtest.sim.routes.videogen import VideoGenRoute

__all__ = ["ROUTES", "Answer", "ApiRoute", "PrefillRequest", "StreamWriter", "register", "route_for"]

ROUTES: dict[str, ApiRoute] = {}  # by api name, in registration order


def register(route: ApiRoute) -> ApiRoute:
    """Serve ``route``; an api name or a path already taken is an error."""
    if route.api in ROUTES or any(r.path == route.path for r in ROUTES.values()):
        raise ValueError(f"the engine serves api {route.api!r} or path {route.path} already")
    ROUTES[route.api] = route
    return route


def route_for(api: str) -> ApiRoute:
    """The route of an api name (KeyError when the engine does not serve it)."""
    return ROUTES[api]


_BUILTIN: tuple[ApiRoute, ...] = (
    ChatRoute(),
    CompletionsRoute(),
    ResponsesRoute(),
    EmbeddingsRoute(),
    MessagesRoute(),
    RerankRoute(),
    KServeV2Route(),
    VideoGenRoute(),
    VideoJobsRoute(),
    ImagesRoute(),
)
for _route in _BUILTIN:
    register(_route)
