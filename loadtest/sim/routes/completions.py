"""POST /v1/completions: a prompt in; text_completion events or one text_completion object."""

from __future__ import annotations

from loadtest.sim.protocol import COMPLETIONS_PATH
from loadtest.sim.routes.chat import ChatRoute


class CompletionsRoute(ChatRoute):
    api = "completions"
    path = COMPLETIONS_PATH
    id_prefix = "cmpl-"
    chat = False
