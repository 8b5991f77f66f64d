"""Real reverse proxies in front of the engine for the tests: nginx (Debian's package, which `python3 dev.py
test` installs), started from a config written here, stopped by its process id."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

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
