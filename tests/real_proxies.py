"""Real reverse proxies in front of the engine for the tests: nginx (Debian's package, which `python3 dev.py
test` installs) and LiteLLM's proxy (PyPI, in its own cached environment: tools/real_engines.py), started
from a config written here, stopped by their process id."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from real_engines import engine_python, stop_process

# nginx's own defaults for a proxied location: proxy_buffering on, HTTP/1.0 to the upstream (whose answer
# then has no chunked framing and is held in nginx's buffers). "off" passes every read on; HTTP/1.1 to the
# upstream (with keep-alive connections, as deployments set it) has nginx forward each chunk as it comes.
NGINX_CONF = """
daemon off;
master_process off;
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log {root}/access.log;
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    upstream engine {{ server 127.0.0.1:{upstream}; keepalive 16; }}
    server {{
        listen 127.0.0.1:{port}{tls};
        {certificates}
        location / {{
            proxy_pass http://engine;
            proxy_buffering {buffering};
            {http11}
        }}
    }}
}}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Nginx:
    """nginx on loopback in front of ``upstream`` (a port): ``buffering`` on (nginx's default) or off,
    HTTP/1.0 to the upstream (the default) or ``http11``, plain HTTP or TLS with the given certificate and
    key files."""

    def __init__(
        self,
        root: Path,
        upstream: int,
        *,
        buffering: bool = True,
        http11: bool = False,
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        binary = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
        if binary is None:
            pytest.skip("nginx is not installed (python3 dev.py test installs Debian's nginx-light)")
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        certificates = f"ssl_certificate {tls[0]}; ssl_certificate_key {tls[1]};" if tls else ""
        conf = NGINX_CONF.format(
            root=root,
            upstream=upstream,
            port=self.port,
            tls=" ssl" if tls else "",
            certificates=certificates,
            buffering="on" if buffering else "off",
            http11='proxy_http_version 1.1; proxy_set_header Connection "";' if http11 else "",
        )
        (root / "nginx.conf").write_text(conf)
        self.base_url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [binary, "-p", str(root), "-c", str(root / "nginx.conf")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"nginx exited {self.proc.returncode}: {self.proc.stderr.read()}")  # type: ignore[union-attr]
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
        self.stop()
        raise AssertionError("nginx did not listen in 20 s")

    def requests(self) -> int:
        """Requests nginx logged (its access log)."""
        log = self.root / "access.log"
        return len(log.read_text().splitlines()) if log.exists() else 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()

    def __enter__(self) -> Nginx:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


LITELLM_CONF = """
model_list:
  - model_name: {model}
    litellm_params:
      model: openai/{model}
      api_base: {upstream}/v1
      api_key: none
"""


class LiteLLMProxy:
    """LiteLLM's proxy (an API gateway) on loopback in front of ``upstream`` (a base URL) serving ``model``,
    offline (its bundled model cost map, no hub), requiring ``master_key`` as the clients' Bearer key."""

    def __init__(self, root: Path, upstream: str, model: str, master_key: str) -> None:
        binary = engine_python("litellm").parent / "litellm"
        root.mkdir(parents=True, exist_ok=True)
        (root / "config.yaml").write_text(LITELLM_CONF.format(model=model, upstream=upstream))
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log = root / "litellm.log"
        env = dict(os.environ, LITELLM_MASTER_KEY=master_key, LITELLM_LOCAL_MODEL_COST_MAP="True")
        env |= {"HF_HUB_OFFLINE": "1", "LITELLM_TELEMETRY": "False"}
        argv = [str(binary), "--config", str(root / "config.yaml"), "--host", "127.0.0.1"]
        argv += ["--port", str(self.port), "--num_workers", "1"]
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env, cwd=root
            )

    def __enter__(self) -> LiteLLMProxy:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"litellm exited {self.proc.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.base_url + "/health/liveliness", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.5)
        self.__exit__()
        raise AssertionError(f"litellm not ready in 120 s:\n{self.tail()}")

    def __exit__(self, *exc: object) -> None:
        stop_process(self.proc, timeout=20)

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""
