"""The version of a started engine: its HTTP version endpoint, else its version command, else "unknown"."""

from __future__ import annotations

import json
import re
import subprocess

from loadtest.serve.plan import LaunchPlan
from loadtest.serve.supervisor import http_ok

VERSION_RE = re.compile(r"\b(\d+\.\d+(?:\.\d+)?(?:[.+\-][0-9A-Za-z.+\-]*)?)")


def from_body(body: str) -> str | None:
    try:
        doc = json.loads(body)
    except ValueError:
        m = VERSION_RE.search(body)
        return m.group(1) if m else None
    if isinstance(doc, dict):
        v = doc.get("version") or doc.get("sglang_version")
        return str(v) if v else None
    return None


def probe_version(plan: LaunchPlan, timeout_s: float = 60.0) -> str:
    for url in plan.version_urls:
        ok, body = http_ok(url, timeout=5)
        if ok and (v := from_body(body)):
            return v
    if plan.version_cmd:
        try:
            out = subprocess.run(
                plan.version_cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL
            )
        except (OSError, subprocess.SubprocessError):
            return "unknown"
        if out.returncode == 0:
            for line in reversed(out.stdout.strip().splitlines()):
                if m := VERSION_RE.search(line):
                    return m.group(1)
    return "unknown"
