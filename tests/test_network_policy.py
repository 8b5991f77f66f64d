"""One network policy for every request (client/network.py): proxies from the environment, CA bundles,
--insecure, credentials only to the endpoint's origin, and host URLs kept whole; all on loopback,
against the real embedded engine behind a forward proxy and a TLS relay written for the tests."""

from __future__ import annotations

import argparse
import json
import os
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from loadtest.cli.endpoint_flags import add_hosts_options
from loadtest.client.http import Endpoint
from loadtest.client.network import NetworkPolicy, bypassed
from loadtest.errors import EXIT_COULD_NOT_RUN
from loadtest.sim import SimProcess
from tests.conftest import CLI, GENERATOR_HEALTH, failed_only_on_delivery, write_profile
from tests.net_servers import ForwardProxy, HeaderLog, TlsRelay

PROXY_VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "all_proxy") + tuple(
    v.upper() for v in ("http_proxy", "https_proxy", "no_proxy", "all_proxy")
)
CA_VARIABLES = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without proxy or CA variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in PROXY_VARIABLES + CA_VARIABLES}
    env.update(extra)
    return env


def run(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``loadtest run`` in a subprocess with ``env`` (the generator's health judged with warn)."""
    cmd = [*CLI, "run", *args, "--generator-health", GENERATOR_HEALTH]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def error_lines(res: subprocess.CompletedProcess[str]) -> list[str]:
    return [ln for ln in res.stderr.splitlines() if ln.startswith("loadtest: error")]


def free_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with SimProcess(speedup=20, seed=3) as s:
        yield s


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def ca_file(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return path


@pytest.fixture(scope="module")
def tls(ca: trustme.CA, sim: SimProcess) -> Iterator[TlsRelay]:
    """The engine's port behind TLS with a certificate of the private CA."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    assert sim.port is not None
    with TlsRelay(ctx, ("127.0.0.1", sim.port)) as relay:
        yield relay


@pytest.fixture
def profile(tmp_path: Path) -> Path:
    return write_profile(
        tmp_path / "p.yaml", output_tokens={"dist": "fixed", "value": 8}, load={"concurrency": 2}
    )


def load_run(out: Path) -> dict[str, Any]:
    return json.loads((out / "run.json").read_text())


def completed(run_doc: dict[str, Any]) -> int:
    return int(run_doc["metrics"]["requests"]["completed"])


def assert_ran_through_relay(res: subprocess.CompletedProcess[str], out: Path) -> None:
    """The run through a relay passed, or failed only on how its events were delivered: on a busy machine
    the relay may pass an answer's events on together, which the verdict rightly calls merged delivery
    (its ITL and TPOT not measurable). These tests' subject is the path, not the verdict."""
    if res.returncode == 0:
        return
    said = res.stdout[-2000:] + res.stderr[-2000:]
    assert (out / "run.json").exists() and failed_only_on_delivery(load_run(out)), said


# ---- the policy itself ----------------------------------------------------------------------------


def test_policy_reads_the_environment_once_lower_case_first() -> None:
    env = {"HTTP_PROXY": "http://upper:1", "http_proxy": "lower:3128", "HTTPS_PROXY": "http://p:8080"}
    env |= {"NO_PROXY": "internal.example, 10.0.0.0/8", "REQUESTS_CA_BUNDLE": "/x/ca.pem"}
    p = NetworkPolicy.from_env(env=env)
    assert (p.http_proxy, p.http_proxy_var) == ("http://lower:3128", "http_proxy")
    assert (p.https_proxy, p.https_proxy_var) == ("http://p:8080", "HTTPS_PROXY")
    assert (p.ca_file, p.ca_file_source) == ("/x/ca.pem", "REQUESTS_CA_BUNDLE")
    assert NetworkPolicy.from_env(ca_bundle="/y/ca.pem", env=env).ca_file_source == "--ca-bundle"
    proxy = p.proxy_for("http://model.example:8000/v1")
    assert proxy is not None and proxy.label == "proxy http://lower:3128 (http_proxy)"
    assert p.proxy_for("http://api.internal.example/v1") is None  # a domain in NO_PROXY
    assert p.proxy_for("http://10.1.2.3:8000") is None  # a CIDR block in NO_PROXY
    assert p.proxy_for("https://10.1.2.3") is None and p.proxy_for("https://11.0.0.1") is not None
    assert NetworkPolicy.from_env(env={}).proxy_for("http://a:1") is None
    assert p == NetworkPolicy.from_data(json.loads(json.dumps(p.to_data())))  # as it crosses to workers


def test_no_proxy_entries() -> None:
    assert bypassed("localhost", 80, "*")
    assert bypassed("a.b.example", 80, ".example") and not bypassed("badexample", 80, "example")
    assert bypassed("h", 8000, "h:8000") and not bypassed("h", 8001, "h:8000")
    assert not bypassed("127.0.0.1", 80, "10.0.0.0/8,, ")


def test_a_proxy_with_credentials_or_a_missing_bundle_is_refused() -> None:
    assert "credentials" in NetworkPolicy.from_env(env={"HTTPS_PROXY": "http://u:p@h:1"}).check()
    why = NetworkPolicy.from_env(ca_bundle="/nonexistent/ca.pem", env={}).check()
    assert why.startswith("--ca-bundle /nonexistent/ca.pem: no such file")


@pytest.mark.parametrize(
    ("host", "route", "target"),
    [
        ("http://h:8000", "/chat/completions", "/v1/chat/completions"),
        ("https://h/api/v1", "/chat/completions", "/api/v1/chat/completions"),
        (
            "https://r.openai.azure.com/openai/v1?api-version=preview",
            "/responses",
            "/openai/v1/responses?api-version=preview",
        ),
        (
            "https://r.openai.azure.com/openai/deployments/gpt4o/chat/completions?api-version=2024-10-21",
            "/chat/completions",
            "/openai/deployments/gpt4o/chat/completions?api-version=2024-10-21",
        ),
        (
            "https://d.cloud.databricks.com/serving-endpoints/llama/invocations",
            "/chat/completions",
            "/serving-endpoints/llama/invocations",
        ),
        ("https://api.anthropic.com/v1/", "/messages", "/v1/messages"),
    ],
)
def test_host_url_templates(host: str, route: str, target: str) -> None:
    assert Endpoint.parse(host).api_path(route) == target


def test_hosts_given_with_commas_are_replicas_and_a_bad_port_is_named() -> None:
    parser = argparse.ArgumentParser()
    add_hosts_options(parser)
    args = parser.parse_args(["--host", "http://a:1, http://b:2", "--host", "http://c:3"])
    assert args.hosts == ["http://a:1", "http://b:2", "http://c:3"] and args.host == "http://a:1"
    with pytest.raises(
        ValueError, match=r"the port in 'a:1,http:' is not a number.*separate them with commas"
    ):
        Endpoint.parse("http://a:1,http://b:2")
    with pytest.raises(ValueError, match=r"host 'http://a:x/v1': the port in 'a:x' is not a number"):
        Endpoint.parse("http://a:x/v1")


def test_raw_replay_keeps_the_host_query_string() -> None:
    from loadtest.client.adapters import adapter_for
    from loadtest.client.openai import PreparedRequest

    raw = adapter_for("raw")
    ep = Endpoint.parse("https://h/openai/v1?api-version=2")
    req = PreparedRequest("r-0", "raw", {"raw": "{}"}, 0, path="/openai/v1/chat/completions")
    assert raw.path(ep, req) == "/openai/v1/chat/completions?api-version=2"
    req.path = "/score?x=1"
    assert raw.path(ep, req) == "/score?x=1&api-version=2"
    with pytest.raises(ValueError, match="fragment"):
        Endpoint.parse("http://h/v1#top")


def test_the_policy_crosses_to_workers_in_the_settings() -> None:
    from loadtest.locust.settings import RunSettings

    policy = NetworkPolicy.from_env(ca_bundle="/c/ca.pem", verify_tls=False, env={"HTTPS_PROXY": "p:3128"})
    s = RunSettings(
        run_id="r", profile_ref="p", host="https://h", out_dir="o", duration_s=1, seed=1, network=policy
    )
    back = RunSettings.from_json(s.to_json())
    assert isinstance(back.network, NetworkPolicy) and back.policy() == policy
    assert RunSettings.from_json(
        RunSettings("r", "p", "h", "o", 1, 1, verify_tls=False).to_json()
    ).policy() == (NetworkPolicy(verify_tls=False))


# ---- through a forward proxy ----------------------------------------------------------------------


@pytest.mark.parametrize("processes", ["1", "2"])
def test_every_request_goes_through_the_http_proxy(
    sim: SimProcess, profile: Path, tmp_path: Path, processes: str
) -> None:
    before = len(sim.truth())
    with ForwardProxy() as proxy:
        args = [
            "--profile",
            str(profile),
            "--host",
            sim.base_url,
            "--duration",
            "2",
            "--processes",
            processes,
        ]
        res = run([*args, "--out", str(tmp_path / "o")], clean_env(HTTP_PROXY=proxy.url))
        assert_ran_through_relay(res, tmp_path / "o")
        doc = load_run(tmp_path / "o")
        targets = [r.target for r in proxy.log]
    assert doc["config"]["network"]["http_proxy"] == proxy.url
    assert f"{sim.base_url}/v1/models" in targets  # the preflight
    posts = [t for t in targets if t.endswith("/v1/chat/completions")]
    # every load request in absolute form through the proxy (the workers' too), and the engine
    # served no request that did not come through it
    assert set(posts) == {f"{sim.base_url}/v1/chat/completions"}
    assert len(posts) >= completed(doc) > 0 and len(sim.truth()) - before == len(posts)
    assert f"{sim.base_url}/metrics" in targets and doc["telemetry"]["series"]  # the metrics poller


def test_the_embedded_engine_is_never_proxied(tmp_path: Path, profile: Path) -> None:
    with ForwardProxy() as proxy:
        args = ["--profile", str(profile), "--duration", "1", "--engine-speedup", "20"]
        res = run([*args, "--out", str(tmp_path / "o")], clean_env(HTTP_PROXY=proxy.url))
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        assert proxy.log == []
    assert completed(load_run(tmp_path / "o")) > 0


def test_no_proxy_sends_the_endpoint_direct(sim: SimProcess, profile: Path, tmp_path: Path) -> None:
    with ForwardProxy() as proxy:
        env = clean_env(HTTP_PROXY=proxy.url, NO_PROXY="localhost,127.0.0.1")
        res = run(
            [
                "--profile",
                str(profile),
                "--host",
                sim.base_url,
                "--duration",
                "1.5",
                "--out",
                str(tmp_path / "o"),
            ],
            env,
        )
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        assert proxy.log == []
    assert completed(load_run(tmp_path / "o")) > 0


def test_an_unreachable_proxy_is_named_in_one_line(sim: SimProcess, profile: Path, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    res = run(
        ["--profile", str(profile), "--host", sim.base_url, "--duration", "1", "--out", str(tmp_path / "o")],
        clean_env(http_proxy=dead),
    )
    assert res.returncode == EXIT_COULD_NOT_RUN, res.stdout + res.stderr
    lines = error_lines(res)
    assert (
        len(lines) == 1
        and f"proxy {dead} (http_proxy)" in lines[0]
        and sim.base_url.split("//")[1] in lines[0]
    )


def test_a_proxy_that_refuses_the_tunnel_is_named_in_one_line(
    tls: TlsRelay, profile: Path, tmp_path: Path
) -> None:
    with ForwardProxy(refuse_connect=True) as proxy:
        args = ["--profile", str(profile), "--host", tls.url, "--duration", "1", "--insecure"]
        res = run([*args, "--out", str(tmp_path / "o")], clean_env(HTTPS_PROXY=proxy.url))
        assert [r.method for r in proxy.log] == ["CONNECT"]
    lines = error_lines(res)
    assert res.returncode == EXIT_COULD_NOT_RUN and len(lines) == 1, res.stderr
    assert f"through proxy {proxy.url} (HTTPS_PROXY)" in lines[0] and "403" in lines[0]


def test_the_load_client_names_a_proxy_that_stops_answering() -> None:
    from loadtest.client.http import Connection, HttpFailure

    dead = f"http://127.0.0.1:{free_port()}"
    policy = NetworkPolicy.from_env(env={"HTTPS_PROXY": dead})
    conn = Connection(Endpoint.parse("https://model.example:8443"), 2.0, policy)
    with pytest.raises(HttpFailure) as e:
        conn.request(b"GET / HTTP/1.1\r\n\r\n", read_timeout=2.0)
    assert e.value.outcome == "connect_error" and f"proxy {dead} (HTTPS_PROXY)" in e.value.message
    with ForwardProxy(refuse_connect=True) as proxy:
        conn = Connection(
            Endpoint.parse("https://model.example:8443"), 2.0, NetworkPolicy(https_proxy=proxy.url)
        )
        with pytest.raises(HttpFailure) as e:
            conn.request(b"GET / HTTP/1.1\r\n\r\n", read_timeout=2.0)
    assert "CONNECT answered 'HTTP/1.1 403 Forbidden'" in e.value.message


# ---- TLS with a private CA ------------------------------------------------------------------------


def test_an_untrusted_certificate_is_one_line(tls: TlsRelay, profile: Path, tmp_path: Path) -> None:
    res = run(
        ["--profile", str(profile), "--host", tls.url, "--duration", "1", "--out", str(tmp_path / "o")],
        clean_env(),
    )
    assert res.returncode == EXIT_COULD_NOT_RUN, res.stdout + res.stderr
    lines = error_lines(res)
    assert len(lines) == 1 and "CERTIFICATE_VERIFY_FAILED" in lines[0] and "--ca-bundle" in lines[0]


@pytest.mark.parametrize("how", ["--ca-bundle", "REQUESTS_CA_BUNDLE", "--insecure"])
def test_a_private_ca_or_insecure_serves_load_and_metrics(
    how: str, tls: TlsRelay, ca_file: Path, profile: Path, tmp_path: Path
) -> None:
    args = ["--profile", str(profile), "--host", tls.url, "--duration", "2", "--out", str(tmp_path / "o")]
    env = clean_env()
    if how == "--ca-bundle":
        args += ["--ca-bundle", str(ca_file)]
    elif how == "--insecure":
        args.append("--insecure")
    else:
        env[how] = str(ca_file)
    res = run(args, env)
    assert_ran_through_relay(res, tmp_path / "o")
    doc = load_run(tmp_path / "o")
    assert completed(doc) > 0 and doc["metrics"]["requests"].get("failed", 0) == 0
    tele = doc.get("telemetry") or {}
    # the poller read the engine's own metrics (vLLM-named) over TLS under the same policy
    assert tele.get("url") == f"{tls.url}/metrics" and tele["engine"] == "vllm" and tele["t"]
    assert doc["config"]["network"]["tls_verify"] is (how != "--insecure")


def test_https_through_the_proxy_by_connect(
    ca: trustme.CA, sim: SimProcess, ca_file: Path, profile: Path, tmp_path: Path
) -> None:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    assert sim.port is not None
    with TlsRelay(ctx, ("127.0.0.1", sim.port)) as tls, ForwardProxy() as proxy:  # this run's own relay
        args = ["--profile", str(profile), "--host", tls.url, "--duration", "2", "--out", str(tmp_path / "o")]
        res = run([*args, "--ca-bundle", str(ca_file)], clean_env(HTTPS_PROXY=proxy.url))
        assert_ran_through_relay(res, tmp_path / "o")
        connects = proxy.requests("CONNECT")
        from_proxy, peers = set(proxy.upstream_ports), set(tls.peers)
    doc = load_run(tmp_path / "o")
    assert connects and all(r.target == f"127.0.0.1:{tls.port}" for r in connects)
    assert peers and peers <= from_proxy  # every connection the endpoint got came through the proxy
    # the preflight, the load's connections (2 users) and each metrics scrape: a tunnel each
    assert doc["telemetry"]["series"] and len(connects) >= 1 + 2 + len(doc["telemetry"]["t"])
    assert completed(doc) > 0 and doc["config"]["network"]["https_proxy"] == proxy.url


# ---- credentials and URLs -------------------------------------------------------------------------


def test_the_key_never_goes_to_a_metrics_url_on_another_origin(
    sim: SimProcess, profile: Path, tmp_path: Path
) -> None:
    key, other_key = "sk-endpoint-0123456789abcdef", "metrics-key-9876543210"
    with HeaderLog() as metrics:
        base = [
            "--profile",
            str(profile),
            "--host",
            sim.base_url,
            "--duration",
            "1.5",
            "--api-key-env",
            "EP_KEY",
        ]
        env = clean_env(EP_KEY=key, OTHER_KEY=other_key)
        res = run([*base, "--metrics-url", f"{metrics.url}/metrics", "--out", str(tmp_path / "a")], env)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        alone = list(metrics.log)
        metrics.log.clear()
        args = [*base, "--metrics-url", f"{metrics.url}/metrics", "--metrics-api-key-env", "OTHER_KEY"]
        res = run([*args, "--out", str(tmp_path / "b")], env)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        own = list(metrics.log)
    assert alone and all("authorization" not in r.headers for r in alone)
    assert own and all(r.headers.get("authorization") == f"Bearer {other_key}" for r in own)
    assert key not in (tmp_path / "b" / "run.json").read_text() and other_key not in res.stdout + res.stderr


@pytest.mark.parametrize("path", ["/v1", "/v1/chat/completions"])
def test_the_host_query_string_is_on_every_request(
    sim: SimProcess, profile: Path, tmp_path: Path, path: str
) -> None:
    query = "?api-version=2024-10-21"
    with ForwardProxy() as proxy:  # the proxy's log shows each request's target as sent
        args = ["--profile", str(profile), "--host", f"{sim.base_url}{path}{query}", "--duration", "1.5"]
        if path != "/v1":
            args += ["--endpoint-check", "none", "--model", "llama-3.1-8b"]
        res = run([*args, "--out", str(tmp_path / "o")], clean_env(HTTP_PROXY=proxy.url))
        assert_ran_through_relay(res, tmp_path / "o")
        posts = [r.target for r in proxy.requests("POST")]
        gets = [r.target for r in proxy.requests("GET")]
    assert len(posts) >= completed(load_run(tmp_path / "o")) > 0
    assert set(posts) == {f"{sim.base_url}/v1/chat/completions{query}"}
    if path == "/v1":
        assert f"{sim.base_url}/v1/models{query}" in gets


def test_the_messages_preflight_speaks_its_api(sim: SimProcess, tmp_path: Path) -> None:
    prof = write_profile(tmp_path / "m.yaml", api="messages", output_tokens={"dist": "fixed", "value": 8})
    with ForwardProxy() as proxy:
        res = run(
            ["--profile", str(prof), "--host", sim.base_url, "--duration", "1", "--out", str(tmp_path / "o")],
            clean_env(HTTP_PROXY=proxy.url),
        )
        models = [r for r in proxy.requests("GET") if r.target.endswith("/v1/models")]
    assert_ran_through_relay(res, tmp_path / "o")
    assert completed(load_run(tmp_path / "o")) > 0
    assert models and all(r.headers.get("anthropic-version") == "2023-06-01" for r in models)


def test_a_refused_preflight_shows_the_server_text(profile: Path, tmp_path: Path) -> None:
    with HeaderLog(status=400, message="anthropic-version: header is required") as srv:
        res = run(
            ["--profile", str(profile), "--host", srv.url, "--duration", "1", "--out", str(tmp_path / "o")],
            clean_env(),
        )
    lines = error_lines(res)
    assert res.returncode == EXIT_COULD_NOT_RUN and len(lines) == 1, res.stderr
    assert "HTTP 400 (anthropic-version: header is required)" in lines[0]
    prof = write_profile(tmp_path / "m.yaml", api="messages")
    with HeaderLog(status=400, message="x" * 500) as srv:
        res = run(
            ["--profile", str(prof), "--host", srv.url, "--duration", "1", "--out", str(tmp_path / "m")],
            clean_env(),
        )
    lines = error_lines(res)
    assert len(lines) == 1 and "is this an Anthropic Messages endpoint?" in lines[0], res.stderr
    assert "x" * 200 + "…)" in lines[0] and "x" * 201 not in lines[0]  # the server's text, bounded
    key = "sk-preflight-0123456789abcdef"
    with HeaderLog(status=401, message=f"invalid key {key}") as srv:
        args = ["--profile", str(profile), "--host", srv.url, "--api-key-env", "K", "--duration", "1"]
        res = run([*args, "--out", str(tmp_path / "k")], clean_env(K=key))
    lines = error_lines(res)
    assert len(lines) == 1 and "HTTP 401 (invalid key ***)" in lines[0], res.stderr
    assert key[4:12] not in res.stdout + res.stderr  # redacted, not even in part


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
