"""`loadtest compare`: side-by-side comparison of runs and sweeps (deltas with confidence intervals)."""

from loadtest.compare.inputs import CompareError, Side, load_side
from loadtest.compare.model import build_comparison

__all__ = ["CompareError", "Side", "build_comparison", "load_side"]
