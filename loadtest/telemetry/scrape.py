"""One scrape of a Prometheus endpoint: the wanted samples only, parsed by prometheus_client, summed."""

from __future__ import annotations

import math
import re
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from loadtest.client.network import NetworkPolicy
from loadtest.telemetry.names import HISTOGRAM_BASES, detect_engine, wanted_names
from loadtest.telemetry.spec_decode import SPEC_NAMES

MAX_BYTES = 16 << 20
# Labels that tell apart ranks of one engine instance: they report the same requests (TensorRT-LLM's
# tensor-parallel ranks, SGLang's tp/pp ranks), so a series takes their largest value, not their sum.
RANK_LABELS = frozenset({"rank", "tp_rank", "pp_rank", "pid", "moe_ep_rank", "attn_tp_rank"})
SAMPLE_NAME = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)")
WANTED = wanted_names() | SPEC_NAMES


class ScrapeError(Exception):
    """The endpoint did not answer 200 with text; ``status`` is the HTTP status when there was one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Scrape:
    """Per sample name: the sum and the mean over label sets (after taking the max over ranks); per
    histogram (base name): its cumulative bucket counts by upper bound, summed the same way."""

    engine: str
    total: dict[str, float] = field(default_factory=dict)
    mean: dict[str, float] = field(default_factory=dict)
    groups: dict[str, int] = field(default_factory=dict)
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)


def fetch(
    url: str, timeout: float, headers: dict[str, str] | None = None, network: NetworkPolicy | None = None
) -> str:
    """The exposition text at ``url``, through the run's network policy (its proxy, CA and --insecure)."""
    req = urllib.request.Request(url, headers={"Accept": "text/plain", **(headers or {})})
    try:
        with (network or NetworkPolicy()).opener(url).open(req, timeout=timeout) as r:
            return r.read(MAX_BYTES).decode("utf-8", errors="replace")
    except urllib.error.HTTPError as e:
        raise ScrapeError(f"HTTP {e.code}", e.code) from e
    except (OSError, ValueError) as e:
        raise ScrapeError(str(getattr(e, "reason", e))) from e


def wanted_lines(text: str) -> str:
    """Only the sample lines of wanted metrics (no # TYPE lines: samples then keep their exact names)."""
    out = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = SAMPLE_NAME.match(line)
        if m and m.group(1) in WANTED:
            out.append(line)
    return "\n".join(out) + "\n"


def parse(text: str) -> Scrape:
    """Sum the wanted samples of an exposition text over label sets (ranks: max)."""
    per_name: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    per_le: dict[str, dict[float, dict[tuple[tuple[str, str], ...], float]]] = {}
    for family in text_string_to_metric_families(wanted_lines(text)):
        for s in family.samples:
            if not math.isfinite(s.value):
                continue
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k not in RANK_LABELS and k != "le"))
            if s.name.endswith("_bucket") and "le" in s.labels:
                try:
                    le = float(s.labels["le"])
                except ValueError:
                    continue
                by_key = per_le.setdefault(s.name.removesuffix("_bucket"), {}).setdefault(le, {})
                by_key[key] = max(by_key.get(key, s.value), s.value)
                continue
            groups = per_name.setdefault(s.name, {})
            groups[key] = max(groups.get(key, s.value), s.value)
    out = Scrape(engine=detect_engine(text))
    for name, groups in per_name.items():
        values = list(groups.values())
        names = [name]
        if not name.endswith(("_total", "_sum", "_count")) and name + "_total" in WANTED:
            names.append(name + "_total")  # an older exporter's counter without the `_total` suffix
        for n in names:
            out.total.setdefault(n, sum(values))
            out.mean.setdefault(n, sum(values) / len(values))
            out.groups.setdefault(n, len(values))
    for base, les in per_le.items():
        if base in HISTOGRAM_BASES:
            out.buckets[base] = {le: sum(by_key.values()) for le, by_key in sorted(les.items())}
    return out


def scrape(
    url: str, timeout: float, headers: dict[str, str] | None = None, network: NetworkPolicy | None = None
) -> Scrape:
    return parse(fetch(url, timeout, headers, network))
