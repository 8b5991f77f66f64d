#!/usr/bin/env python3
"""Derive statistics and empirical length tables from the shared traces into traffic_profiles/derived/."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from loadtest.metrics.run_length import evidence_duration_s
from loadtest.metrics.slo import Slo, parse_slos
from loadtest.traces import (
    TraceFormatError,
    empirical_spec,
    read_trace,
    sniff_format,
    trace_block_tokens,
    trace_stats,
)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACES = REPO.parent / "shared" / "traces"
DEFAULT_OUT = REPO / "traffic_profiles" / "derived"
SUFFIXES = (".csv", ".jsonl", ".csv.gz", ".jsonl.gz")

CITATIONS = {
    "azure": (
        "Patel, Choukse, Zhang, Shah, Goiri, Maleki, Bianchini. Splitwise: Efficient generative LLM "
        "inference using phase splitting. ISCA 2024."
    ),
    "mooncake": (
        "Qin, Li, He, Zhang, Wu, Zheng, Xu. Mooncake: Trading More Storage for Less Computation - "
        "A KVCache-centric Architecture for Serving LLM Chatbot. USENIX FAST 2025."
    ),
    "burstgpt": "Wang et al. BurstGPT: A Real-world Workload Dataset to Optimize LLM Serving Systems. 2024.",
    "bailian": (
        "Wang et al. KVCache Cache in the Wild: Characterizing and Optimizing KVCache Cache at a Large "
        "Cloud Provider. USENIX ATC 2025."
    ),
}
LICENSE_MARKERS = (("Attribution 4.0 International", "CC-BY-4.0"), ("Apache License", "Apache-2.0"))
UNITS = {
    "count": "requests",
    "duration_s": "s",
    "mean_rate_rps": "req/s",
    "interarrival_mean_s": "s",
    "interarrival_cv": "ratio",
    "peak_1s_rate_rps": "req/s",
    "peak_to_mean": "x mean",
    "input_tokens": "tokens",
    "output_tokens": "tokens",
    "prefix_reuse_share": "of blocks",
    "prefix_reuse_token_share": "of prompt tokens",
    "mean_blocks_per_request": "blocks",
    "unique_blocks": "blocks",
}


def trace_name(path: Path, fmt: str) -> str:
    """Short name: azure-conv, mooncake-conversation, else <format>-<stem>."""
    stem = path.name.split(".")[0]
    if fmt == "azure":
        return "azure-" + stem.rsplit("_", 1)[-1].lower()
    if fmt == "mooncake":
        return "mooncake-" + stem.removesuffix("_trace").lower()
    return f"{fmt}-{stem.lower().replace('_', '-')}"


def license_of(folder: Path) -> dict[str, str]:
    """The LICENSE file next to a trace and the license it names."""
    for lic in sorted(folder.glob("LICENSE*")):
        head = lic.read_text(encoding="utf-8", errors="replace")[:2000]
        spdx = next((name for marker, name in LICENSE_MARKERS if marker in head), "see file")
        return {"file": lic.name, "spdx": spdx}
    return {"file": "", "spdx": "unknown"}


def _round(value: Any) -> Any:
    """Round floats (recursively) to 4 decimals for a readable YAML."""
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items()}
    if isinstance(value, float):
        return round(value, 4)
    return value


def derive_one(path: Path) -> tuple[str, dict[str, Any]]:
    """Read one trace and build its derived document."""
    fmt = sniff_format(path)
    records = read_trace(path, fmt)
    stats = _round(trace_stats(records, trace_block_tokens(path, fmt)))  # the format's block size
    doc = {
        "name": trace_name(path, fmt),
        "source": {
            "file": path.name,
            "format": fmt,
            "license": license_of(path.parent),
            "citation": CITATIONS.get(fmt, ""),
        },
        "stats": stats,
        "arrival": {"rate": stats["mean_rate_rps"], "cv": stats["interarrival_cv"]},
        "input_tokens": empirical_spec([r.input_tokens for r in records]),
        "output_tokens": empirical_spec([r.output_tokens for r in records]),
    }
    return doc["name"], doc


def find_traces(folder: Path) -> list[Path]:
    """Trace files (CSV/JSONL, optionally gzipped) under folder, sorted."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES))


def stat_lines(name: str, stats: dict[str, Any]) -> list[str]:
    """`name.stat: value unit` lines for every statistic (nested length quantiles flattened)."""
    lines = []
    for key, value in stats.items():
        unit = UNITS.get(key, "")
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for sub, v in items:
            label = f"{name}.{key}" + (f".{sub}" if sub else "")
            lines.append(f"{label}: {v:g} {unit}".rstrip())
    return lines


def derive(traces: Path, out: Path | None) -> dict[str, dict[str, Any]]:
    """Derive every trace under `traces`; write `<out>/<name>.yaml` unless out is None."""
    docs: dict[str, dict[str, Any]] = {}
    for path in find_traces(traces):
        try:
            name, doc = derive_one(path)
        except TraceFormatError as exc:
            print(f"skipped {path}: {exc}", file=sys.stderr)
            continue
        docs[name] = doc
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            header = f"# Derived by tools/derive_trace_stats.py from {path.name}; do not edit by hand.\n"
            text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100)
            (out / f"{name}.yaml").write_text(header + text, encoding="utf-8")
    return docs


# Shipped profiles generated from the derived statistics: (trace, profile file, what to add).
SHIPPED = {
    "azure-conv": (
        "azure-conversation",
        "Chat traffic shaped like the Azure LLM inference trace 2023 (conversation): its prompt and answer "
        "length quantiles, its mean rate and its inter-arrival CV (gamma arrivals).",
        {"slos": {"ttft_p99": "2s", "tpot_p99": "100ms", "error_rate": "0.5%"}},
    ),
    "azure-code": (
        "azure-code",
        "Code-completion traffic shaped like the Azure LLM inference trace 2023 (code): long prompts, short "
        "answers and very bursty arrivals (gamma arrivals with the trace's inter-arrival CV).",
        {"slos": {"ttft_p99": "1s", "tpot_p99": "50ms", "error_rate": "0.5%"}},
    ),
    "mooncake-conversation": (
        "mooncake-conversation",
        "Long-context chat shaped like the Mooncake FAST'25 conversation trace: its length quantiles (contexts "
        "up to ~126k tokens) and about its prefix reuse, approximated by 32 shared prefix groups of up to 6,144 "
        "tokens (~37 % of prompt tokens shared); Poisson arrivals at its mean rate (its timestamps come in ~3 s "
        "ticks). For the exact reuse, replay the trace itself: "
        "load: {trace: {path: <conversation_trace.jsonl>, format: mooncake}} with scenarios: [{name: replay, kind: trace}].",
        {
            "prefix": {"groups": 32, "tokens": 6144},
            # The trace's timestamps come in ~3 s ticks, so its inter-arrival CV (3.0) measures the ticks,
            # not burstiness: Poisson arrivals at its mean rate instead.
            "poisson": True,
            "slos": {"ttft_p99": "10s", "tpot_p99": "100ms", "error_rate": "0.5%"},
            # The trace's rate at its mean prompt (12k tokens, ~37 % cached) needs ~26k new prompt tokens/s:
            # one H200 prefills ~28k/s for this model, so TP 2 (~51k/s) keeps it below saturation.
            "engine": {"gpu": "H200", "model": "llama-3.1-8b", "tp": 2},
        },
    ),
}


def default_duration_s(doc: dict[str, Any], extra: dict[str, Any]) -> int:
    """The shipped profile's default length: whole minutes, long enough that its arrivals (the trace's
    rate and spread) prove its strictest SLO percentile by early stopping (docs/verdict.md)."""
    p = max(s.p for s in parse_slos(extra["slos"]) if isinstance(s, Slo))
    cv = 1.0 if extra.get("poisson") else doc["arrival"]["cv"]
    seconds = evidence_duration_s(p, doc["arrival"]["rate"], cv)
    return int(-(-seconds // 60) * 60)


def shipped_profile(name: str, doc: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The shipped profile built from one trace's derived statistics, or None for traces without one."""
    if name not in SHIPPED:
        return None
    file_name, description, extra = SHIPPED[name]
    src = doc["source"]
    scenario: dict[str, Any] = {
        "name": file_name,
        "input_tokens": doc["input_tokens"],
        "output_tokens": doc["output_tokens"],
        "ignore_eos": True,
    }
    if "prefix" in extra:
        scenario["prefix"] = extra["prefix"]
    profile: dict[str, Any] = {
        "name": file_name,
        "description": description,
        "source": f"{src['file']} ({src['license']['spdx']}): {src['citation']}",
        "api": "chat",
        "tokenizer": "llama3",
        "seed": 0,
        "duration_s": default_duration_s(doc, extra),
        "load": (
            {"rate": doc["arrival"]["rate"], "arrival": "poisson"}
            if extra.get("poisson")
            else {"rate": doc["arrival"]["rate"], "arrival": "gamma", "cv": doc["arrival"]["cv"]}
        ),
        "scenarios": [scenario],
        "slos": extra["slos"],
    }
    if "engine" in extra:
        profile["engine"] = extra["engine"]
    return file_name, profile


def write_shipped(docs: dict[str, dict[str, Any]], folder: Path) -> list[Path]:
    """Write traffic_profiles/<name>.yaml for each trace that has a shipped profile."""
    written = []
    for name, doc in docs.items():
        made = shipped_profile(name, doc)
        if made is None:
            continue
        file_name, profile = made
        path = folder / f"{file_name}.yaml"
        header = (
            f"# {profile['description']}\n# Generated by tools/derive_trace_stats.py from {doc['source']['file']} "
            "(lengths: empirical quantile tables; arrivals: the trace's mean rate and inter-arrival CV).\n"
            "# Regenerate with: python tools/derive_trace_stats.py\n"
        )
        path.write_text(header + yaml.safe_dump(profile, sort_keys=False, default_flow_style=None, width=100))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    """Command line: derive, print the figures, write the YAML files."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="folder holding the traces")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write <trace>.yaml")
    parser.add_argument("--no-write", action="store_true", help="print the figures only")
    args = parser.parse_args(argv)
    if not args.traces.is_dir():
        print(f"no trace folder at {args.traces}", file=sys.stderr)
        return 2
    docs = derive(args.traces, None if args.no_write else args.out)
    for name, doc in docs.items():
        print("\n".join(stat_lines(name, doc["stats"])))
    if not args.no_write:
        print(f"wrote {len(docs)} file(s) to {args.out}", file=sys.stderr)
        for path in write_shipped(docs, args.out.parent):
            print(f"wrote {path}", file=sys.stderr)
    return 0 if docs else 1


if __name__ == "__main__":
    sys.exit(main())
