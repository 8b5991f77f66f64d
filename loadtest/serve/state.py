"""server.json: what a launcher started (engine, version, argv, env additions), kept by URL for runs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import urllib.parse
from pathlib import Path
from typing import Any

# A flag or variable naming a secret; not the counts and paths named after tokens (--max-num-batched-tokens,
# --tokenizer).
SECRET_FLAG = re.compile(r"(key|token(?!s|izer)|secret|password|passwd)", re.IGNORECASE)
LOOPBACK = {"localhost", "127.0.0.1", "0.0.0.0", "::1", "::"}
# What a run keeps in run.json's endpoint.server (no pids, log paths or the launcher's own bookkeeping).
RUN_KEYS = (
    "engine", "version", "preset", "model", "mode", "gpus", "url", "metrics_urls", "layout", "processes", "started",
)  # fmt: skip


def state_dir() -> Path:
    """``$LOADTEST_STATE_DIR``, else ``$XDG_STATE_HOME/loadtest``, else ``~/.local/state/loadtest``."""
    if env := os.environ.get("LOADTEST_STATE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "loadtest"


def normalize_url(url: str) -> str:
    """scheme://host:port with loopback spellings made one, so that a run finds its server's record."""
    u = urllib.parse.urlsplit(url.strip())
    host = (u.hostname or "").lower()
    host = "127.0.0.1" if host in LOOPBACK else host
    port = u.port or (443 if u.scheme == "https" else 80)
    return f"{u.scheme or 'http'}://{host}:{port}"


def state_file(url: str) -> Path:
    key = hashlib.sha256(normalize_url(url).encode()).hexdigest()[:16]
    return state_dir() / "servers" / f"{key}.json"


def scrub_argv(argv: list[str]) -> list[str]:
    """The argv with the value after any --*key* / --*token* / --*secret* / --*password* flag hidden."""
    out: list[str] = []
    hide = False
    for a in argv:
        if hide:
            out.append("***")
            hide = False
            continue
        if a.startswith("-") and SECRET_FLAG.search(a):
            if "=" in a:
                out.append(a.split("=", 1)[0] + "=***")
                continue
            hide = True
        out.append(a)
    return out


def scrub_env(env: dict[str, str]) -> dict[str, str]:
    return {k: ("***" if SECRET_FLAG.search(k) else v) for k, v in env.items()}


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)


def register(doc: dict[str, Any]) -> Path:
    path = state_file(doc["url"])
    write_json(path, doc)
    return path


def unregister(url: str, launcher_pid: int) -> None:
    """Forget the record of ``url`` if this launcher wrote it."""
    path = state_file(url)
    try:
        if json.loads(path.read_text()).get("launcher_pid") == launcher_pid:
            path.unlink()
    except (OSError, ValueError):
        pass


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def for_run(doc: dict[str, Any]) -> dict[str, Any]:
    """The part of a server.json that a run records in run.json (endpoint.server)."""
    out = {k: doc.get(k) for k in RUN_KEYS if k in doc}
    out["processes"] = [
        {"name": p.get("name"), "role": p.get("role"), "argv": p.get("argv"), "env": p.get("env")}
        for p in doc.get("processes") or []
    ]
    return out


def server_info_for(host: str, path: str | None = None) -> dict[str, Any] | None:
    """The server record for a run against ``host``: the ``--server-info`` file, else the one a running
    launcher keeps for that URL; None when there is none. ValueError names a bad file."""
    if path:
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"--server-info {path}: {getattr(e, 'strerror', None) or e}") from e
        if not isinstance(doc, dict) or "engine" not in doc:
            raise ValueError(
                f"--server-info {path}: not a server.json (no `engine`); `loadtest serve` writes one"
            )
        return for_run(doc)
    try:
        doc = json.loads(state_file(host).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not _alive(doc.get("launcher_pid")):
        return None
    return for_run(doc)


def metrics_urls_for(info: dict[str, Any] | None) -> list[str]:
    return list((info or {}).get("metrics_urls") or [])
