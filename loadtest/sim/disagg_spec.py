"""The disaggregated-serving setting: prefill and decode instances and the KV link (``P:D@GBPS``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Disagg:
    """``prefill`` and ``decode`` instances (each ``tp`` GPUs) and the KV link's GB/s per GPU
    (0: the GPU's NVLink, one direction)."""

    prefill: int = 0
    decode: int = 0
    link_gbs: float = 0.0

    def __post_init__(self) -> None:
        if self.prefill < 0 or self.decode < 0 or self.link_gbs < 0:
            raise ValueError("prefill and decode instances and the link bandwidth must be >= 0")
        if (self.prefill > 0) != (self.decode > 0):
            raise ValueError("disaggregation needs at least one prefill and one decode instance")

    @property
    def enabled(self) -> bool:
        return self.prefill > 0 and self.decode > 0


def parse_disagg(text: str) -> Disagg:
    """``P:D`` or ``P:D@GBPS`` (prefill and decode instances, KV link GB/s per GPU), e.g. ``1:3@50``."""
    pools, _, link = text.partition("@")
    p_text, sep, d_text = pools.partition(":")
    try:
        if not sep:
            raise ValueError
        spec = Disagg(int(p_text), int(d_text), float(link) if link else 0.0)
        if not spec.enabled:
            raise ValueError("both pools need an instance")
        return spec
    except ValueError as e:
        detail = f" ({e})" if str(e) else ""
        raise ValueError(
            f"disaggregation {text!r}{detail}: write P:D or P:D@GBPS, prefill and decode instances >= 1 "
            "and the KV link's GB/s per GPU, e.g. 1:3@50"
        ) from e
