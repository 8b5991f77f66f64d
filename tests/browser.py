"""Headless chromium for the report tests: load a local page over the DevTools pipe, check what it did."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).parent / "artifacts"  # screenshots (gitignored)


class _Cdp:
    """Chrome DevTools Protocol over --remote-debugging-pipe (fd 3 in, fd 4 out, NUL-separated JSON)."""

    def __init__(self, profile_dir: Path) -> None:
        assert CHROMIUM is not None
        cmd_r, cmd_w = os.pipe()
        evt_r, evt_w = os.pipe()
        hi_r, hi_w = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 100), fcntl.fcntl(evt_w, fcntl.F_DUPFD, 100)
        for fd in (cmd_r, evt_w):
            os.close(fd)

        def wire() -> None:
            os.dup2(hi_r, 3)
            os.dup2(hi_w, 4)

        args = [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile_dir}",
            "--remote-debugging-pipe",
            "about:blank",
        ]
        self.proc = subprocess.Popen(
            args, pass_fds=(3, 4), preexec_fn=wire, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        os.close(hi_r)
        os.close(hi_w)
        self.w, self.r = cmd_w, evt_r
        self.buf = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.r], [], [], max(0.0, left))
            if not ready:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self.r, 1 << 20)
            if not chunk:
                raise EOFError("chromium closed the pipe")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(
        self, method: str, session: str | None = None, timeout: float = 60, **params: Any
    ) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            m = self._read(deadline)
            if m.get("id") == self.next_id:
                assert "error" not in m, (method, m["error"])
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, method: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        for m in self.events:
            if m.get("method") == method:
                return m
        while True:
            m = self._read(deadline)
            self.events.append(m)
            if m.get("method") == method:
                return m

    def close(self) -> None:
        with contextlib.suppress(TimeoutError, EOFError, OSError, AssertionError):
            self.call("Browser.close", timeout=10)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        os.close(self.w)
        os.close(self.r)


def _open_page(cdp: _Cdp, url: str, width: int, height: int, network: bool = True) -> str:
    """A new tab of ``width`` × ``height`` CSS pixels with ``url`` loaded; its session id."""
    target = cdp.call("Target.createTarget", url="about:blank")["targetId"]
    sid: str = cdp.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
    for domain in ("Runtime", "Log", *(("Network",) if network else ()), "Page"):
        cdp.call(f"{domain}.enable", sid)
    cdp.call(
        "Emulation.setDeviceMetricsOverride",
        sid,
        width=width,
        height=height,
        deviceScaleFactor=1,
        mobile=False,
    )
    cdp.call("Page.navigate", sid, url=url)
    cdp.wait_event("Page.loadEventFired")
    return sid


def open_in_chromium(
    page: Path,
    shot: Path,
    profile_dir: Path,
    expect_plots: int,
    evaluate: str | None = None,
    first_screen: Path | None = None,
) -> dict[str, Any]:
    """Load a local page; wait for ``expect_plots`` plotly charts; screenshot; report requests, errors, charts.

    ``evaluate``: a JavaScript expression whose value (JSON-serializable) comes back as ``found["value"]``,
    evaluated once the charts are drawn; ``first_screen``: also a screenshot of the first viewport (1280 × 900).
    """
    cdp = _Cdp(profile_dir)
    try:
        url = page.resolve().as_uri()
        sid = _open_page(cdp, url, 1280, 900)
        probe = (
            "JSON.stringify({plots: document.querySelectorAll('.js-plotly-plot').length,"
            " svgs: document.querySelectorAll('.js-plotly-plot .main-svg').length,"
            " titles: [...document.querySelectorAll('.js-plotly-plot .gtitle')].map(e => e.textContent),"
            " traces: [...document.querySelectorAll('.js-plotly-plot')].map(g => (g.data || []).length),"
            " cards: document.querySelectorAll('.card').length})"
        )
        found: dict[str, Any] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = json.loads(cdp.call("Runtime.evaluate", sid, expression=probe)["result"]["value"])
            if found["plots"] >= expect_plots and found["svgs"] >= expect_plots:
                break
            time.sleep(0.2)
        if evaluate is not None:
            found["value"] = json.loads(
                cdp.call("Runtime.evaluate", sid, expression=f"JSON.stringify({evaluate})")["result"]["value"]
            )
        if first_screen is not None:
            first = cdp.call("Page.captureScreenshot", sid, format="png")
            first_screen.parent.mkdir(parents=True, exist_ok=True)
            first_screen.write_bytes(base64.b64decode(first["data"]))
        size = cdp.call("Page.getLayoutMetrics", sid)["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        png = cdp.call("Page.captureScreenshot", sid, format="png", captureBeyondViewport=True, clip=clip)
        shot.parent.mkdir(parents=True, exist_ok=True)
        shot.write_bytes(base64.b64decode(png["data"]))
        cdp.call("Runtime.evaluate", sid, expression="1")  # drain late events
        ev = cdp.events
        found["requests"] = [
            e["params"]["request"]["url"] for e in ev if e.get("method") == "Network.requestWillBeSent"
        ]
        found["errors"] = [
            e["params"]
            for e in ev
            if e.get("method") == "Runtime.exceptionThrown"
            or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
            or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")
        ]
        found["url"] = url
        return found
    finally:
        cdp.close()


class LivePage:
    """A page kept open in headless chromium (a live one, e.g. the UI's dashboard): evaluate, wait, screenshot."""

    def __init__(self, url: str, profile_dir: Path, width: int = 1280, height: int = 900) -> None:
        self.cdp = _Cdp(profile_dir)
        try:
            self.sid = _open_page(self.cdp, url, width, height, network=False)
        except BaseException:
            self.cdp.close()
            raise

    def __enter__(self) -> LivePage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cdp.close()

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression in the page."""
        res = self.cdp.call("Runtime.evaluate", self.sid, expression=f"JSON.stringify({expression})")
        value = res["result"].get("value")
        return None if value is None else json.loads(value)

    def wait_for(self, expression: str, timeout: float = 30) -> Any:
        """Poll until the expression is truthy; its value (TimeoutError with the last value otherwise)."""
        deadline = time.monotonic() + timeout
        value = None
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.2)
        raise TimeoutError(f"{expression} stayed {value!r} for {timeout} s")

    def screenshot(self, shot: Path) -> bytes:
        """A full-page PNG written to ``shot``; its bytes."""
        size = self.cdp.call("Page.getLayoutMetrics", self.sid)["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        png = self.cdp.call(
            "Page.captureScreenshot", self.sid, format="png", captureBeyondViewport=True, clip=clip
        )
        data = base64.b64decode(png["data"])
        shot.parent.mkdir(parents=True, exist_ok=True)
        shot.write_bytes(data)
        return data

    def errors(self) -> list[dict[str, Any]]:
        """The page's uncaught exceptions and console errors so far."""
        self.cdp.call("Runtime.evaluate", self.sid, expression="1")  # drain late events
        return [
            e["params"]
            for e in self.cdp.events
            if e.get("method") == "Runtime.exceptionThrown"
            or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
        ]


def open_url(url: str, shot: Path, profile_dir: Path, ready: str, timeout: float = 40) -> dict[str, Any]:
    """Load a page served over http; wait until the JavaScript expression ``ready`` is true; screenshot;
    return the page's text, whether it got ready, its requests and its errors."""
    cdp = _Cdp(profile_dir)
    try:
        sid = _open_page(cdp, url, 1400, 1000)
        got_ready = False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = cdp.call("Runtime.evaluate", sid, expression=f"Boolean({ready})")["result"].get("value")
            if value:
                got_ready = True
                break
            time.sleep(0.25)
        time.sleep(0.5)  # the chart's transitions
        png = cdp.call("Page.captureScreenshot", sid, format="png")
        shot.parent.mkdir(parents=True, exist_ok=True)
        shot.write_bytes(base64.b64decode(png["data"]))
        text = cdp.call("Runtime.evaluate", sid, expression="document.body.innerText")["result"].get(
            "value", ""
        )
        ev = cdp.events
        return {
            "ready": got_ready,
            "text": text,
            "requests": [
                e["params"]["request"]["url"] for e in ev if e.get("method") == "Network.requestWillBeSent"
            ],
            "errors": [e["params"] for e in ev if e.get("method") == "Runtime.exceptionThrown"],
        }
    finally:
        cdp.close()
