"""Sweeps: concurrency and rate ladders, the rate search, and the sweep.json contract (docs/sweep.md)."""

from loadtest.sweep.model import SweepFormatError, load_sweep, sweep_root

__all__ = ["SweepFormatError", "load_sweep", "sweep_root"]
