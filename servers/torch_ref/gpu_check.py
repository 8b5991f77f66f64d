"""Measure the torch server with loadtest (batch 1, then a concurrency ladder) next to the embedded
engine's roofline prediction for the same GPU and model presets; prints ``name: value unit`` lines."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from loadtest.sim.clock import decode_step_time_s, prefill_time_s, step_time_s
from loadtest.sim.presets import EngineConfig, get_gpu, get_model

ROOT = Path(__file__).resolve().parents[2]


def predict(gpu: str, model: str, concurrency: int, prompt: int, output: int) -> dict[str, float]:
    """The embedded engine's step-time model for a closed loop of ``concurrency`` streams.

    ITL: a decode step of the whole batch at the mean context (prompt + output/2), plus the extra
    time of the steps that also prefill a new prompt (one per request: concurrency/output of them).
    TTFT: alone, the prompt's prefill; with company, the step it shares plus half a decode step of
    waiting for the step in progress.
    """
    cfg = EngineConfig(gpu=get_gpu(gpu), model=get_model(model))
    ctx = prompt + output // 2
    t_dec = decode_step_time_s(cfg, concurrency, ctx)
    t_mix = step_time_s(cfg, [(prompt, 0)] + [(1, ctx)] * (concurrency - 1))
    itl = t_dec + min(1.0, concurrency / max(output, 1)) * (t_mix - t_dec)
    ttft = prefill_time_s(cfg, prompt) if concurrency == 1 else t_mix + t_dec / 2
    tps = concurrency * output / (ttft + (output - 1) * itl)
    return {"itl_ms": itl * 1e3, "ttft_ms": ttft * 1e3, "output_tps": tps}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"the server was not healthy within {timeout:.0f} s")


def stop_server(proc: subprocess.Popen[Any]) -> None:
    """Stop a server process: SIGINT, then SIGKILL after 30 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def _profile(path: Path, prompt: int, output: int, concurrency: int, duration: float) -> Path:
    prof = {
        "name": "gpu-check",
        "api": "chat",
        "system_prompt_tokens": 0,
        "input_tokens": {"dist": "fixed", "value": prompt},
        "output_tokens": {"dist": "fixed", "value": output},
        "load": {"concurrency": concurrency},
        "duration_s": duration,
        "seed": 1,
    }
    path.write_text(json.dumps(prof))
    return path


def _run_point(url: str, out: Path, c: int, args: argparse.Namespace) -> dict[str, Any]:
    prof = _profile(out / f"profile-c{c}.json", args.input_tokens, args.output_tokens, c, args.duration)
    run_dir = out / f"c{c}"
    cmd = [sys.executable, "-m", "loadtest.cli.main", "run", "--profile", str(prof), "--host", url,
           "--concurrency", str(c), "--duration", str(args.duration), "--out", str(run_dir)]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.duration + 300)
    doc_path = run_dir / "run.json"
    if not doc_path.is_file():
        raise RuntimeError(
            f"loadtest run at concurrency {c} wrote no run.json (exit {p.returncode}): {p.stderr[-500:]}"
        )
    return json.loads(doc_path.read_text())


def _stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/stats", timeout=10) as r:
        return json.loads(r.read())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m servers.torch_ref.gpu_check", description=__doc__)
    ap.add_argument("--config", default="llama-3.1-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--gpu", default="H200", help="GPU preset of the prediction (default H200)")
    ap.add_argument("--model", default="Llama-3.1-8B", help="model preset of the prediction")
    ap.add_argument("--ladder", default="1,8,32,64", help="concurrency levels (default 1,8,32,64)")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds per level (default 20)")
    ap.add_argument("--input-tokens", type=int, default=512)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--out", default="reports/gpu-check", help="folder for the run folders and server log")
    ap.add_argument("--startup-timeout", type=float, default=300.0)
    ap.add_argument(
        "--tiny",
        action="store_true",
        help="dry mode: tiny config on cpu, ladder 1,2, 2 s per level, short lengths",
    )
    args = ap.parse_args(argv)
    if args.tiny:
        args.config, args.device, args.ladder, args.duration = "tiny", "cpu", "1,2", 2.0
        args.input_tokens, args.output_tokens = 32, 8
    try:
        ladder = [int(x) for x in args.ladder.split(",") if x.strip()]
    except ValueError:
        print(f"error: --ladder {args.ladder}: comma-separated integers expected", file=sys.stderr)
        return 2
    if not ladder or min(ladder) < 1:
        print("error: --ladder needs concurrency levels >= 1", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = [sys.executable, "-m", "servers.torch_ref", "--config", args.config, "--device", args.device,
              "--port", str(port), "--max-num-seqs", str(max(ladder)),
              "--max-model-len", str(args.input_tokens + args.output_tokens + 64)]  # fmt: skip
    if args.dtype:
        server += ["--dtype", args.dtype]
    t0 = time.monotonic()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(out / "server.log", "wb") as log:
        proc = subprocess.Popen(server, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_healthy(url, proc, args.startup_timeout)
        info = _stats(url)
        print(f"server_startup_s: {time.monotonic() - t0:.1f} s")
        print(
            f"server_device: {info['device_name']} ({info['dtype']}, {info['model']['params'] / 1e9:.3g} B params)"
        )
        for c in ladder:
            doc = _run_point(url, out, c, args)
            lat = doc["metrics"]["latency_ms"]
            pred = predict(args.gpu, args.model, c, args.input_tokens, args.output_tokens)
            ok = doc["metrics"]["requests"]["ok"]
            print(f"requests_ok_c{c}: {ok} count")
            print(f"measured_itl_ms_c{c}: {lat['itl']['p50']:.2f} ms")
            print(f"predicted_itl_ms_c{c}: {pred['itl_ms']:.2f} ms")
            print(f"measured_tpot_mean_ms_c{c}: {lat['tpot']['mean']:.2f} ms")
            print(f"measured_ttft_ms_c{c}: {lat['ttft']['p50']:.2f} ms")
            print(f"predicted_ttft_ms_c{c}: {pred['ttft_ms']:.2f} ms")
            print(
                f"measured_output_tps_c{c}: {doc['metrics']['throughput']['output_tokens_per_s']:.1f} tok/s"
            )
            print(f"predicted_output_tps_c{c}: {pred['output_tps']:.1f} tok/s")
            print(
                f"token_mismatches_c{c}: {doc['metrics']['tokens']['mismatched_requests']} count", flush=True
            )
        eng = _stats(url)["engine"]
        print(f"engine_steps: {eng['steps']} count")
        print(f"engine_busy_s: {eng['busy_s']:.1f} s")
        print(f"gpu_check_wall_s: {time.monotonic() - t0:.1f} s")
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:
        print(f"error: {e} (server log: {out / 'server.log'})", file=sys.stderr)
        return 1
    finally:
        stop_server(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
