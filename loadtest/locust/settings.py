"""Run settings shared by the master and every worker process (serialized to JSON, never holding secrets)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(slots=True)
class RunSettings:
    run_id: str
    profile: str  # shipped name or path
    host: str
    out_dir: str
    duration_s: float
    seed: int
    concurrency: int | None = None
    rate: float | None = None
    arrival: str = "poisson"
    model: str | None = None
    api_key_env: str | None = None  # the NAME of the variable holding the key; the key itself is never stored
    processes: int = 1
    connect_timeout: float = 10.0
    read_timeout: float = 300.0
    verify_tls: bool = True
    embedded: bool = False

    @property
    def mode(self) -> str:
        return "open" if self.rate is not None else "closed"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RunSettings:
        return cls(**json.loads(text))

    def write(self, path: Path) -> None:
        path.write_text(self.to_json())

    @classmethod
    def read(cls, path: Path) -> RunSettings:
        return cls.from_json(path.read_text())
