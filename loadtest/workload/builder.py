"""Turns a profile into concrete, deterministic requests: request i is the same for any worker layout."""

from __future__ import annotations

import hashlib
import json
import random

from loadtest.client.openai import PreparedRequest
from loadtest.profile.schema import Profile
from loadtest.workload.lengths import sample_length
from loadtest.workload.text import synth_text
from loadtest.workload.tokenizer import get_tokenizer

_SYSTEM_LEAD = "You are a helpful assistant. Answer the user's question clearly."


class Workload:
    """Builds request ``i`` of a run from the profile and seed alone."""

    def __init__(self, profile: Profile, seed: int | None = None) -> None:
        self.profile = profile
        self.seed = profile.seed if seed is None else seed
        self.tokenizer = get_tokenizer(profile.tokenizer)
        rng = random.Random(f"{self.seed}:system")
        self.system_prompt = (
            _SYSTEM_LEAD
            + synth_text(max(0, profile.system_prompt_tokens - self.tokenizer.count(_SYSTEM_LEAD)), rng)
            if profile.system_prompt_tokens
            else ""
        )
        self._system_messages = (
            [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        )
        # Template and system-prompt tokens around the user's text (the same for every request).
        self._chat_overhead = self.tokenizer.count_chat(
            [*self._system_messages, {"role": "user", "content": ""}]
        )

    def request(self, index: int) -> PreparedRequest:
        p = self.profile
        rng = random.Random(f"{self.seed}:{index}")
        n_in = sample_length(p.input_tokens, rng)
        n_out = max(1, sample_length(p.output_tokens, rng))
        body: dict = {"max_tokens": n_out}
        if p.ignore_eos:
            body["ignore_eos"] = True
            body["min_tokens"] = n_out
        if p.api == "chat":
            # Hit the target for the whole templated prompt: subtract template and system overhead.
            user_text = synth_text(max(1, n_in - self._chat_overhead), rng, self.tokenizer)
            messages = [*self._system_messages, {"role": "user", "content": user_text}]
            body["messages"] = messages
            prompt_tokens = self.tokenizer.count_chat(messages)
        else:
            prompt = synth_text(max(1, n_in), rng, self.tokenizer)
            body["prompt"] = prompt
            prompt_tokens = self.tokenizer.count(prompt)
        return PreparedRequest(
            request_id=f"{self.seed:x}-{index}",
            api=p.api,
            body=body,
            prompt_tokens=prompt_tokens,
            requested_output_tokens=n_out,
            scenario=p.name,
            stream=p.stream,
        )

    def fingerprint(self, n: int = 64) -> str:
        """A hash of the profile and the first ``n`` requests: equal fingerprints mean equal workloads."""
        h = hashlib.sha256(json.dumps(self.profile.model_dump(mode="json"), sort_keys=True).encode())
        h.update(str(self.seed).encode())
        for i in range(n):
            r = self.request(i)
            h.update(json.dumps(r.body, sort_keys=True).encode())
        return h.hexdigest()
