"""Through a real nginx in front of the embedded engine: with nginx's defaults (`proxy_buffering on`, HTTP/1.0
to the upstream) the run is not a PASS and its first reason names the buffering; with buffering off, or
HTTP/1.1 to the upstream, the client's figures are the engine's; over TLS from a private CA the run works
with `--ca-bundle` and says why it cannot without."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from loadtest.metrics.verdict import MERGED_DELIVERY
from loadtest.sim import SimProcess
from tests.conftest import read_lines, run_cli, write_profile
from tests.real_proxies import Nginx

SLOS = "ttft_p90=30s,itl_p90=5s,tpot_p90=5s,error_rate=50%"  # p90: a 4 s run has the evidence
TOKENS = 64


def _run(tmp_path: Path, url: str, *extra: str) -> tuple[Any, dict[str, Any], list[dict[str, Any]]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    prof = write_profile(
        tmp_path / "p.yaml",
        output_tokens={"dist": "fixed", "value": TOKENS},
        load={"concurrency": 4},
        judging={"warmup_s": 0},
    )
    out = tmp_path / "out"
    args = ["run", "--profile", str(prof), "--host", url, "--duration", "4", "--slo", SLOS, "--out", str(out)]
    res = run_cli([*args, *extra], timeout=180)
    doc = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
    records = read_lines([out / "records.jsonl"]) if (out / "records.jsonl").exists() else []
    return res, doc, records


def _engine_ttft_ms(sim: SimProcess) -> float:
    """The engine's own TTFT median (its truth log: first token written − request arrived)."""
    return statistics.median(
        (t["first_token_ns"] - t["arrival_ns"]) / 1e6 for t in sim.truth() if t["first_token_ns"]
    )


def _client_ttft_ms(records: list[dict[str, Any]]) -> float:
    return statistics.median(r["ttft_us"] / 1000 for r in records if r["outcome"] == "ok")


def test_default_buffering_is_not_a_pass_and_is_named_first(tmp_path: Path) -> None:
    with SimProcess(speedup=2, seed=5) as sim, Nginx(tmp_path / "nginx", sim.port) as nginx:
        res, doc, records = _run(tmp_path, nginx.base_url)
        engine = _engine_ttft_ms(sim)
        proxied = nginx.requests()
    assert doc, res.stderr[-3000:]
    ok = [r for r in records if r["outcome"] == "ok"]
    assert len(ok) >= 8 and proxied >= len(ok)  # every answer came through nginx
    verdict = doc["verdict"]
    assert verdict["status"] != "pass" and res.returncode != 0
    assert verdict["reasons"][0].startswith("merged delivery:"), verdict["reasons"]
    assert "buffering proxy" in verdict["reasons"][0]
    by = {c["name"]: c for c in verdict["checks"]}
    assert by["itl_p90"]["detail"].startswith("not measurable") and by["itl_p90"]["value"] is None
    # what users of that deployment feel: the first token waits for nginx's buffer, not for the engine
    client = _client_ttft_ms(records)
    assert client > 2 * engine, (client, engine)
    print(f"nginx defaults: TTFT p50 client {client:.1f} ms, engine {engine:.1f} ms")


@pytest.mark.parametrize(
    "shape",
    [{"buffering": False}, {"buffering": True, "http11": True}],
    ids=["buffering-off", "http11-upstream"],
)
def test_a_stream_passed_on_measures_the_engine(tmp_path: Path, shape: dict[str, bool]) -> None:
    with SimProcess(speedup=2, seed=5) as sim, Nginx(tmp_path / "nginx", sim.port, **shape) as nginx:
        res, doc, records = _run(tmp_path, nginx.base_url)
        engine = _engine_ttft_ms(sim)
    assert doc, res.stderr[-3000:]
    verdict = doc["verdict"]
    assert MERGED_DELIVERY not in {c["name"] for c in verdict["checks"]}
    assert verdict["status"] == "pass", verdict["reasons"]
    merged = doc["metrics"]["itl_merged"]
    assert merged["merged_streams"] <= merged["streams"] // 4, merged
    client = _client_ttft_ms(records)
    assert client < 1.5 * engine + 20, (client, engine)  # the engine's, plus nginx's and the client's share
    print(f"nginx {shape}: TTFT p50 client {client:.1f} ms, engine {engine:.1f} ms")


def test_tls_from_a_private_ca_needs_the_ca_bundle(tmp_path: Path) -> None:
    trustme = pytest.importorskip("trustme", reason="trustme (the test extra) makes the private CA")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file, ca_file = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    ca.cert_pem.write_to_path(str(ca_file))
    tls = (cert_file, key_file)
    with (
        SimProcess(speedup=2, seed=5) as sim,
        Nginx(tmp_path / "nginx", sim.port, buffering=False, tls=tls) as ng,
    ):
        untrusted, _, _ = _run(tmp_path / "a", ng.base_url)
        res, doc, records = _run(tmp_path / "b", ng.base_url, "--ca-bundle", str(ca_file))
    assert untrusted.returncode != 0 and "Traceback" not in untrusted.stderr
    err = [ln for ln in untrusted.stderr.splitlines() if "certificate" in ln.lower()]
    assert err, untrusted.stderr[-2000:]
    assert res.returncode == 0, res.stderr[-3000:]
    assert records and all(r["outcome"] == "ok" for r in records)
    assert doc["config"]["network"]["ca_file"] == str(ca_file)
    # each stream's one connection: opened with a TLS handshake, then kept alive for its next requests
    conns = doc["metrics"]["connections"]
    assert conns["requests"] == len(records) and 1 <= conns["opened"] <= 8 and conns["reused"] >= 1
    assert conns["tls_ms"]["p50"] > 0 and conns["headers_ms"]["p50"] > 0
    opened = [r["new_connection"] for r in records if "new_connection" in r]
    assert len(opened) == conns["opened"] and all(len(o) == 4 and o[3] > 0 for o in opened)
    report = (tmp_path / "b" / "out" / "report.html").read_text()
    assert 'id="connections"' in report and "TLS handshake" in report
