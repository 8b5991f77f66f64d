"""The shape of run.json is a contract: the key paths of a seeded run against the embedded engine equal the
committed list (tests/data/run_json_keys.txt). A change of shape is deliberate: document it in
docs/run-json.md, then rewrite the list with ``.venv/bin/python tests/test_run_json_shape.py --write``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from conftest import run_cli, write_profile  # noqa: E402

KEYS_FILE = HERE / "data" / "run_json_keys.txt"
# Maps keyed by something the run chose (a series or scenario name) are kept to their own path.
OPEN_MAPS = ("/telemetry/series", "/metrics/by_scenario", "/endpoint/engine")


def key_paths(doc: Any, prefix: str = "") -> set[str]:
    """Every key path of a JSON document, ``/a/b/c``; lists are not descended into."""
    out: set[str] = set()
    if isinstance(doc, dict):
        for k, v in doc.items():
            path = f"{prefix}/{k}"
            out.add(path)
            if not prefix.startswith(OPEN_MAPS) and path not in OPEN_MAPS:
                out |= key_paths(v, path)
    return out


def seeded_run_keys(tmp: Path) -> set[str]:
    prof = write_profile(
        tmp / "seeded.yaml",
        input_tokens={"dist": "fixed", "value": 64},
        output_tokens={"dist": "uniform", "min": 8, "max": 16},
        load={"concurrency": 4},
        seed=11,
    )
    out = tmp / "out"
    res = run_cli(
        ["run", "--profile", str(prof), "--duration", "4", "--engine-speedup", "5", "--out", str(out)]
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return key_paths(json.loads((out / "run.json").read_text()))


def test_run_json_has_the_committed_shape(tmp_path: Path) -> None:
    got = seeded_run_keys(tmp_path)
    want = set(KEYS_FILE.read_text().split())
    assert got == want, {"added": sorted(got - want), "gone": sorted(want - got)}


if __name__ == "__main__" and "--write" in sys.argv:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        KEYS_FILE.write_text("\n".join(sorted(seeded_run_keys(Path(d)))) + "\n")
    print(f"wrote {KEYS_FILE}")
