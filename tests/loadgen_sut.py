"""A real MLPerf LoadGen run (mlcommons-loadgen) against an in-process SUT with a given latency shape.

Run as a script in the folder LoadGen writes its logs to:
``python tests/loadgen_sut.py SCENARIO QPS TTFT_MS TPOT_MS TOKENS MIN_DURATION_MS MIN_QUERIES TTFT_LIMIT_MS TPOT_LIMIT_MS``.
"""

from __future__ import annotations

import array
import sys
import threading
import time

import mlperf_loadgen as lg  # type: ignore[import-not-found]


def main(argv: list[str]) -> None:
    scenario, qps, ttft_ms, tpot_ms, tokens, min_ms, min_q, ttft_lim, tpot_lim = argv
    n_tokens = int(tokens)

    def answer(sample_id: int) -> None:
        time.sleep(float(ttft_ms) / 1000)
        first = array.array("q", [1])
        addr, n = first.buffer_info()
        lg.FirstTokenComplete([lg.QuerySampleResponse(sample_id, addr, n * first.itemsize)])
        time.sleep(float(tpot_ms) * (n_tokens - 1) / 1000)
        out = array.array("q", [1] * n_tokens)
        addr, n = out.buffer_info()
        lg.QuerySamplesComplete([lg.QuerySampleResponse(sample_id, addr, n * out.itemsize, n_tokens)])

    def issue(queries: list) -> None:  # type: ignore[type-arg]
        for q in queries:
            threading.Thread(target=answer, args=(q.id,), daemon=True).start()

    settings = lg.TestSettings()
    settings.scenario = getattr(lg.TestScenario, scenario)
    settings.mode = lg.TestMode.PerformanceOnly
    settings.server_target_qps = float(qps)
    settings.offline_expected_qps = float(qps)
    settings.single_stream_expected_latency_ns = int(1e9 / float(qps))
    settings.min_duration_ms = int(min_ms)
    settings.min_query_count = int(min_q)
    settings.use_token_latencies = True
    settings.ttft_latency = int(float(ttft_lim) * 1_000_000)
    settings.tpot_latency = int(float(tpot_lim) * 1_000_000)
    sut = lg.ConstructSUT(issue, lambda: None)
    qsl = lg.ConstructQSL(64, 64, lambda _: None, lambda _: None)
    lg.StartTest(sut, qsl, settings)
    lg.DestroyQSL(qsl)
    lg.DestroySUT(sut)


if __name__ == "__main__":
    main(sys.argv[1:])
