"""MLPerf Endpoints' reference client and `loadtest run` (its `endpoints` convention) on the same real vLLM.

    .venv/bin/python tests/bench/bench_endpoints_agreement.py \\
        --mlperf-endpoints /opt/venv/bin/inference-endpoint --mlperf-root IMAGE \\
        [--concurrency 1,4,16] [--samples 192] [--tokens 64] [--rounds 2]

The project's tiny model (servers/tiny_llama.py) served by the real vLLM's CPU build (`loadtest serve
vllm --preset tiny-llama-cpu`, on the last core; the clients on core 0). Both clients send the same
prompt file (one ``prompt`` per line) as streamed chat completions at temperature 0, ``--tokens`` output
tokens each (the tiny model's head never ends an answer early), the model's own tokenizer and chat
template for their token counts. One unmeasured pass over the prompts first fills vLLM's prefix cache,
so every measured request finds its prompt cached, whichever client runs first.

At each concurrency and in each round, the reference client's `benchmark online --load-pattern
concurrency` (its result_summary.json) and `loadtest run --max-requests` then `loadtest report
--convention endpoints` (its result_summary.json) issue the same number of requests; the order of the
two alternates between rounds. Printed per concurrency: each client's system_tps, tps_per_user,
TTFT P90 and TPOT P90 (medians over the rounds) and loadtest's over the reference client's (the median
of each round's ratio, the rounds in brackets), then a table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))  # tests/real_engines: the engine's environment and launcher
sys.path.insert(0, str(HERE))

from harness import ServerProcess  # noqa: E402
from mlperf_peer import Peer  # noqa: E402
from real_engines import ServedVllm  # noqa: E402

from loadtest.workload.text import WORDS  # noqa: E402

FIGURES = ("system_tps", "tps_per_user", "ttft_p90_ms", "tpot_p90_ms")
# Printed beside them, to tell where a difference comes from: the token count, the medians, the time base.
DETAILS = ("osl_avg", "ttft_p50_ms", "tpot_p50_ms", "latency_p50_ms", "duration_s")
UNITS = {"system_tps": "tok/s", "tps_per_user": "tok/s", "osl_avg": "tokens", "duration_s": "s"}
CLIENT_CORE = "0"  # the reference client is pinned there too (mlperf_peer.Peer.argv)


def write_prompts(path: Path, count: int) -> None:
    """``count`` prompts of 20-220 words, seeded: the same file for both clients."""
    import random

    rng = random.Random(7)
    with path.open("w") as f:
        for i in range(count):
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 220)))
            f.write(json.dumps({"prompt": f"Question {i}: {words}"}) + "\n")


def figures(summary: dict[str, Any]) -> dict[str, float]:
    """The four compared figures from a result_summary.json (either client's: the same Report schema)."""
    tpot_ms = summary["tpot"]["percentiles"]["90.0"] / 1e6
    return {
        "system_tps": float(summary["tps"]),
        "tps_per_user": 1000.0 / tpot_ms,
        "ttft_p90_ms": summary["ttft"]["percentiles"]["90.0"] / 1e6,
        "tpot_p90_ms": tpot_ms,
        "osl_avg": summary["output_sequence_lengths"]["avg"],
        "ttft_p50_ms": summary["ttft"]["percentiles"]["50.0"] / 1e6,
        "tpot_p50_ms": summary["tpot"]["percentiles"]["50.0"] / 1e6,
        "latency_p50_ms": summary["latency"]["percentiles"]["50.0"] / 1e6,
        "duration_s": summary["duration_ns"] / 1e9,
    }


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.peer = Peer(command=args.mlperf_endpoints, root=Path(args.mlperf_root))
        self.scratch, self.inside = self.peer.scratch()
        self.model = work / "tiny-llama"
        subprocess.run([sys.executable, str(ROOT / "servers" / "tiny_llama.py"), str(self.model)], check=True)
        shutil.copytree(self.model, self.scratch / "tiny-llama")
        self.prompts = work / "prompts.jsonl"
        write_prompts(self.prompts, args.prompts)
        shutil.copy(self.prompts, self.scratch / "prompts.jsonl")
        self.profile = work / "agreement.yaml"
        self.profile.write_text(
            json.dumps(
                {
                    "name": "endpoints-agreement",
                    "api": "chat",
                    "stream": True,
                    "seed": 1,
                    "request": {"extra_body": {"temperature": 0}},
                    "scenarios": [
                        {
                            "name": "prompts",
                            "ignore_eos": False,
                            "dataset": {
                                "path": str(self.prompts),
                                "output_tokens": {"dist": "fixed", "value": args.tokens},
                            },
                        }
                    ],
                }
            )
        )
        self.n = 0

    def loadtest(self, url: str, concurrency: int, samples: int) -> dict[str, float]:
        self.n += 1
        out = self.work / f"loadtest-{self.n}"
        argv = [sys.executable, "-m", "loadtest.cli.main", "run", "-p", str(self.profile), "--host", url]
        argv += ["-c", str(concurrency), "--max-requests", str(samples), "--duration", "900s"]
        argv += ["--tokenizer", str(self.model), "--warmup", "0", "--cooldown", "0", "-q"]
        argv += ["--generator-health", "warn", "--out", str(out)]
        if self.args.paced:  # the bench server lists no models
            argv += ["--endpoint-check", "none", "--model", "tiny-llama"]
        res = subprocess.run(["taskset", "-c", CLIENT_CORE, *argv], capture_output=True, text=True, cwd=ROOT)
        if not (out / "run.json").exists():  # any verdict will do: the figures are what is compared
            raise SystemExit(f"loadtest run failed ({res.returncode}): {res.stderr[-3000:]}")
        report = [sys.executable, "-m", "loadtest.cli.main", "report", str(out), "--convention", "endpoints"]
        subprocess.run(report, check=True, capture_output=True, cwd=ROOT)
        summary = json.loads((out / "result_summary.json").read_text())
        if summary["n_samples_completed"] != samples:
            raise SystemExit(f"loadtest completed {summary['n_samples_completed']} of {samples}")
        return figures(summary)

    def reference(self, url: str, concurrency: int, samples: int) -> dict[str, float]:
        self.n += 1
        report = f"{self.inside}/report-{self.n}"
        cmd = self.peer.argv(self.peer.command, "benchmark", "online", "--model", "tiny-llama")
        cmd += [
            "--endpoints",
            url,
            "--dataset",
            f"{self.inside}/prompts.jsonl",
            "--load-pattern",
            "concurrency",
        ]
        cmd += ["--concurrency", str(concurrency), "--num-samples", str(samples), "--duration", "0s"]
        cmd += ["--workers", "1", "--streaming", "on", "--no-cpu-affinity", "--report-dir", report]
        cmd += ["--max-output-tokens", str(self.args.tokens), "--model-params.temperature", "0"]
        cmd += ["--tokenizer", f"{self.inside}/tiny-llama"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        here = self.peer.root / report.lstrip("/") / "performance" / "result_summary.json"
        if res.returncode or not here.exists():
            raise SystemExit(f"the reference client failed ({res.returncode}): {res.stdout[-3000:]}")
        summary = json.loads(here.read_text())
        if summary["n_samples_completed"] != samples or summary["n_samples_failed"]:
            raise SystemExit(f"the reference client: {summary['n_samples_completed']} of {samples} completed")
        return figures(summary)


def line(name: str, value: float, unit: str) -> None:
    print(f"{name}: {value:.4g} {unit}".rstrip(), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--mlperf-endpoints", required=True, help="the inference-endpoint command (in the image)"
    )
    parser.add_argument("--mlperf-root", default="/", help="the system image it runs in (chroot)")
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated concurrencies")
    parser.add_argument("--samples", type=int, default=192, help="requests per point per client")
    parser.add_argument("--prompts", type=int, default=64, help="prompts in the file")
    parser.add_argument("--tokens", type=int, default=64, help="output tokens of every answer")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep both clients' run folders")
    parser.add_argument(
        "--paced",
        metavar="TTFT_MS,ITL_MS",
        help="instead of vLLM, the paced bench server (sse_server.py) with this first-token delay and token "
        "gap: each client's TTFT and TPOT beside the server's own",
    )
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    work = Path(tempfile.mkdtemp(prefix="bench-agreement-"))
    bench = Bench(args, work)
    server: ServedVllm | ServerProcess
    if args.paced:
        ttft_ms, itl_ms = (float(x) for x in args.paced.split(","))
        server = ServerProcess(
            "paced", "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms), "--tokens", str(args.tokens)
        )
        url = f"http://127.0.0.1:{server.port}"
        line("server_ttft", ttft_ms, "ms")
        line("server_tpot", itl_ms, "ms")
    else:
        server = ServedVllm(bench.model, work / "vllm")
    ours: dict[int, list[dict[str, float]]] = {c: [] for c in levels}
    theirs: dict[int, list[dict[str, float]]] = {c: [] for c in levels}
    try:
        if isinstance(server, ServedVllm):
            server.wait_ready()
            url = server.url
            bench.loadtest(url, 4, args.prompts)  # fills the prefix cache with every prompt
        for r in range(args.rounds):
            for c in levels:
                if r % 2 == 0:
                    theirs[c].append(bench.reference(url, c, args.samples))
                    ours[c].append(bench.loadtest(url, c, args.samples))
                else:
                    ours[c].append(bench.loadtest(url, c, args.samples))
                    theirs[c].append(bench.reference(url, c, args.samples))
                for f in FIGURES:
                    ratio = ours[c][-1][f] / theirs[c][-1][f]
                    print(
                        f"# round {r + 1}, concurrency {c}, {f}: loadtest/reference {ratio:.4f}", flush=True
                    )
    finally:
        server.stop()
        if args.keep:
            shutil.copytree(bench.scratch, work / "reference", ignore=shutil.ignore_patterns("tiny-llama"))
        shutil.rmtree(bench.scratch, ignore_errors=True)
    rows = []
    for c in levels:
        cells = []
        for f in FIGURES:
            a = statistics.median(x[f] for x in ours[c])
            b = statistics.median(x[f] for x in theirs[c])
            ratios = [o[f] / t[f] for o, t in zip(ours[c], theirs[c], strict=True)]
            med = statistics.median(ratios)
            line(f"c{c}_loadtest_{f}", a, UNITS.get(f, "ms"))
            line(f"c{c}_reference_{f}", b, UNITS.get(f, "ms"))
            line(f"c{c}_loadtest_vs_reference_{f}", med, "x")
            spread = ", ".join(f"{x:.3f}" for x in ratios)
            cells.append(f"{a:.4g} / {b:.4g} ({(med - 1) * 100:+.2f} %; {spread})")
        rows.append(f"| {c} | " + " | ".join(cells) + " |")
        for f in DETAILS:
            a = statistics.median(x[f] for x in ours[c])
            b = statistics.median(x[f] for x in theirs[c])
            line(f"c{c}_loadtest_{f}", a, UNITS.get(f, "ms"))
            line(f"c{c}_reference_{f}", b, UNITS.get(f, "ms"))
    print("\n| concurrency | " + " | ".join(f"{f}: loadtest / reference" for f in FIGURES) + " |")
    print("|---" * (len(FIGURES) + 1) + "|")
    print("\n".join(rows))
    if args.keep:
        print(f"# run folders kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
