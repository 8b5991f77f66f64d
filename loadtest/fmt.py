"""Number formatting shared by the HTML and console reports."""

from __future__ import annotations

NA = "—"


def fmt_ms(v: float | int | None, na: str = NA) -> str:
    """A millisecond value with precision that shrinks as it grows (0.123, 1.23, 12.3, 1,234)."""
    if v is None:
        return na
    a = abs(v)
    if a >= 100:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def fmt_num(v: float | int | None, digits: int = 1, na: str = NA) -> str:
    """A float with thousands separators and a fixed number of decimals."""
    return na if v is None else f"{v:,.{digits}f}"


def fmt_int(v: float | int | None, na: str = NA) -> str:
    """An integer with thousands separators."""
    return na if v is None else f"{int(v):,}"


def fmt_pct(fraction: float | None, na: str = NA) -> str:
    """A 0..1 fraction as a percentage with two decimals."""
    return na if fraction is None else f"{fraction * 100:.2f}%"


def short_hash(h: str | None, n: int = 12) -> str:
    """The first ``n`` characters of a hex digest, with an ellipsis when shortened."""
    if not h:
        return NA
    return h if len(h) <= n else h[:n] + "…"
