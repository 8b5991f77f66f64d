"""Several endpoints in one run: which replica each request goes to (round-robin, least-outstanding, session)."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable
from pathlib import Path

from loadtest.client.openai import OpenAIClient, PreparedRequest
from loadtest.client.record import RequestRecord

BALANCE_MODES = ("round-robin", "least-outstanding", "session")


def read_hosts_file(path: str | Path) -> list[str]:
    """Base URLs from a file, one a line; blank lines and ``#`` comments are skipped. ValueError if none."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"--hosts-file {p}: cannot read it ({e.strerror or e})") from e
    hosts = [ln.split("#", 1)[0].strip() for ln in text.splitlines()]
    hosts = [h for h in hosts if h]
    if not hosts:
        raise ValueError(f"--hosts-file {p}: no URL in it (one base URL a line, e.g. http://10.0.0.5:8000)")
    return hosts


def session_slot(key: str, n: int) -> int:
    """The replica of a session: a stable hash, the same in every process and run."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") % n


class Balancer:
    """One per process: picks the endpoint of each request and counts what is outstanding at each."""

    def __init__(self, n: int, mode: str = "round-robin") -> None:
        if mode not in BALANCE_MODES:
            raise ValueError(f"balance {mode!r}: use one of {', '.join(BALANCE_MODES)}")
        self.n = n
        self.mode = mode
        self.outstanding = [0] * n
        self._rr = itertools.count()

    def pick(self, req: PreparedRequest) -> int:
        if self.n == 1:
            return 0
        session = getattr(req, "session", None)
        if self.mode == "session" and session:
            return session_slot(session, self.n)
        if self.mode == "least-outstanding":
            start = next(self._rr) % self.n  # ties go round the replicas, not always to the first
            order = [(start + k) % self.n for k in range(self.n)]
            return min(order, key=lambda i: self.outstanding[i])
        return next(self._rr) % self.n


class BalancedClient:
    """OpenAIClient's interface over several endpoints: one keep-alive client per endpoint, made when first used."""

    def __init__(self, make: Callable[[str], OpenAIClient], hosts: list[str], balancer: Balancer) -> None:
        self._make = make
        self.hosts = hosts
        self.balancer = balancer
        self._clients: dict[int, OpenAIClient] = {}

    def client(self, index: int) -> OpenAIClient:
        c = self._clients.get(index)
        if c is None:
            c = self._clients[index] = self._make(self.hosts[index])
        return c

    def send(
        self,
        req: PreparedRequest,
        scheduled_ns: int,
        scheduled_epoch: float,
        record: RequestRecord | None = None,
    ) -> RequestRecord:
        i = self.balancer.pick(req)
        rec = record or RequestRecord(request_id=req.request_id)
        rec.endpoint = i
        self.balancer.outstanding[i] += 1
        try:
            return self.client(i).send(req, scheduled_ns, scheduled_epoch, rec)
        finally:
            self.balancer.outstanding[i] -= 1

    def close(self) -> None:
        for c in self._clients.values():
            c.close()


# What a stream sends with: one endpoint's client, or the balanced one over several (the same interface)
StreamClient = OpenAIClient | BalancedClient
