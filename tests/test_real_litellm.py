"""Through LiteLLM's proxy (an API gateway) in front of the embedded engine: the stream passes on chunk by chunk.

The same load direct and through the gateway: every count through it is the engine's, no stream arrives
merged, but under load the gateway re-sends the tokens in bursts of separate reads far closer together
than the stream's pace: the run gets the burst-delivery diagnosis (ITL and TPOT not measurable) that the
direct run never gets; TTFT carries the gateway's own time, and its missing /metrics is named in a note.
"""

from __future__ import annotations

import json
import secrets
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from real_proxies import LiteLLMProxy

from loadtest.metrics.verdict import MERGED_DELIVERY
from loadtest.sim import SimProcess
from tests.conftest import read_lines, run_cli, write_profile

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(600)]
SLOS = "ttft_p50=30s,tpot_p50=5s,error_rate=50%"  # p50: a 4 s run has the evidence


def _run(tmp: Path, url: str) -> tuple[Any, dict[str, Any], list[dict[str, Any]]]:
    tmp.mkdir(parents=True, exist_ok=True)
    prof = write_profile(
        tmp / "p.yaml",
        output_tokens={"dist": "uniform", "min": 16, "max": 96},
        load={"concurrency": 16},  # under load the gateway sends in bursts (docs/metrics.md)
        judging={"warmup_s": 0},
    )
    args = ["run", "--profile", str(prof), "--host", url, "--duration", "4", "--slo", SLOS]
    res = run_cli([*args, "--api-key-env", "LITELLM_TEST_KEY", "--out", str(tmp / "out")], timeout=180)
    doc = json.loads((tmp / "out" / "run.json").read_text()) if (tmp / "out" / "run.json").exists() else {}
    return res, doc, read_lines(sorted((tmp / "out").glob("records*.jsonl")))


def _warm(url: str, model: str, key: str) -> None:
    """One request first: a fresh gateway's first answer pays its one-time setup (about 4 s here)."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(), headers)
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200


def test_litellm_sends_the_stream_in_bursts_and_adds_its_own_ttft(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "sk-" + secrets.token_hex(16)
    monkeypatch.setenv("LITELLM_TEST_KEY", key)
    with SimProcess(speedup=1, seed=5) as sim:
        with urllib.request.urlopen(sim.base_url + "/v1/models", timeout=10) as r:
            model = json.loads(r.read())["data"][0]["id"]
        direct_res, direct, direct_records = _run(tmp_path / "direct", sim.base_url)
        with LiteLLMProxy(tmp_path / "litellm", sim.base_url, model, key) as gw:
            _warm(gw.base_url, model, key)
            res, doc, records = _run(tmp_path / "gw", gw.base_url)
            gw_log = gw.tail()
        truth = sim.truth()
    assert direct_res.returncode == 0, direct_res.stderr[-3000:]
    assert res.returncode == 11, res.stderr[-3000:] + gw_log  # invalid: the verdict's delivery diagnosis
    ok = [r for r in records if r["outcome"] == "ok"]
    assert len(ok) >= 8 and len(ok) == len(records)
    # every answer's length through the gateway is one the engine produced, and its usage agrees
    produced = Counter(t["completion_tokens"] for t in truth if t["outcome"] == "ok")
    sent = Counter(r["output_tokens"] for r in ok + direct_records)
    assert not sent - produced, sent - produced
    assert all(r["usage_completion_tokens"] == r["output_tokens"] for r in ok)
    # direct from the engine: no stream in bursts, no diagnosis, the run passes
    direct_merged = direct["metrics"]["itl_merged"]
    assert direct_merged["burst_streams"] == 0 and direct_merged["merged_streams"] == 0, direct_merged
    assert direct["verdict"]["status"] == "pass", direct["verdict"]["reasons"]
    # through the gateway: no answer arrives merged, but most arrive in bursts, which the verdict names
    # first; its ITL and TPOT SLOs are not measurable
    merged = doc["metrics"]["itl_merged"]
    assert merged["merged_streams"] <= merged["streams"] // 10, merged
    assert merged["burst_streams"] >= merged["streams"] // 2 and merged["burst_gaps"] > 0, merged
    assert doc["verdict"]["status"] != "pass"
    assert doc["verdict"]["reasons"][0].startswith("burst delivery: "), doc["verdict"]["reasons"]
    assert "ITL times the proxy, not the server" in doc["verdict"]["reasons"][0]
    checks = {c["name"]: c for c in doc["verdict"]["checks"]}
    assert not checks[MERGED_DELIVERY]["passed"]
    assert "not measurable" in checks["tpot_p50"]["detail"], checks["tpot_p50"]
    assert "DELIVERY" in res.stdout and "DELIVERY" not in direct_res.stdout
    lat, lat0 = doc["metrics"]["latency_ms"], direct["metrics"]["latency_ms"]
    assert lat["ttft"]["p50"] > lat0["ttft"]["p50"]  # the gateway's own share of the first token
    assert any("metrics" in n and "404" in n for n in doc["notes"]), doc["notes"]  # it has no /metrics
    print(
        f"\nlitellm: TTFT p50 {lat['ttft']['p50']:.1f} ms (direct {lat0['ttft']['p50']:.1f}), ITL p50 "
        f"{lat['itl']['p50']:.2f} ms (direct {lat0['itl']['p50']:.2f}), TPOT p50 {lat['tpot']['p50']:.2f} ms "
        f"(direct {lat0['tpot']['p50']:.2f}), merged gaps {merged['share'] * 100:.1f} %, streams in bursts "
        f"{merged['burst_streams']} of {merged['streams']} ({merged['burst_gaps']} burst gaps)"
    )
