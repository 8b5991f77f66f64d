"""Accuracy runs: benchmark targets, dataset loaders, scorers and accuracy.json (docs/accuracy.md)."""
