"""MLCommons seed sets: ``--seed-set FILE:COHORT[:SET]`` read into the run's three seeds (schedule, sample index, model)."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

SEED_KEYS = ("scheduler_rng_seed", "sample_index_rng_seed", "model_seed")
_MAX_SEED = 2**64 - 1


class SeedSetError(ValueError):
    """A seed-set file or selection that cannot be used; the message names the file, the field and the fix."""


@dataclass(frozen=True, slots=True)
class SeedSet:
    """One set of a cohort: the seeds that drive every RNG of a run, and where they came from."""

    file: str
    sha256: str
    cohort: str
    set: str
    scheduler_rng_seed: int  # the arrival schedule
    sample_index_rng_seed: int  # which sample each query sends (the workload's draws)
    model_seed: int  # recorded; sent to a server whose API takes `seed`

    def record(self) -> dict[str, Any]:
        """run.json's ``config.seed_set``."""
        return asdict(self)


def split_spec(spec: str) -> tuple[str, str, str | None]:
    """``FILE:COHORT[:SET]`` → (file, cohort, set or None)."""
    parts = spec.rsplit(":", 2)
    if len(parts) == 3 and Path(parts[0]).suffix in (".yaml", ".yml"):
        return parts[0], parts[1], parts[2] or None
    parts = spec.rsplit(":", 1)
    if len(parts) == 2 and Path(parts[0]).suffix in (".yaml", ".yml") and parts[1]:
        return parts[0], parts[1], None
    raise SeedSetError(f"--seed-set {spec}: expected FILE.yaml:COHORT[:SET] (e.g. seedset.yaml:v1.0:set1)")


def _seed(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_SEED:
        raise SeedSetError(f"{where}: {value!r} is not a seed; fix: an integer from 0 to 2^64 − 1")
    return value


def load_seed_set(spec: str) -> SeedSet:
    """The set ``spec`` names; the file's form: ``cohorts: {COHORT: {SET: {scheduler_rng_seed: N,
    sample_index_rng_seed: N, model_seed: N}}}`` (docs/sources.md §2). Without SET a cohort of one set
    gives that set."""
    file, cohort, chosen = split_spec(spec)
    path = Path(file).expanduser()
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise SeedSetError(
            f"--seed-set {file}: cannot read it ({e.strerror or e}); fix: the path of a seed-set YAML file"
        ) from e
    try:
        doc = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise SeedSetError(
            f"{file}: not YAML ({str(e).splitlines()[0]}); fix: a seed-set file (cohorts: ...)"
        ) from e
    cohorts = doc.get("cohorts") if isinstance(doc, dict) else None
    if not isinstance(cohorts, dict) or not cohorts:
        raise SeedSetError(
            f"{file}: no `cohorts` mapping; fix: cohorts: {{COHORT: {{SET: {{{', '.join(SEED_KEYS)}}}}}}}"
        )
    sets = cohorts.get(cohort)
    if not isinstance(sets, dict) or not sets:
        names = ", ".join(str(c) for c in cohorts)
        raise SeedSetError(
            f"{file}: no cohort {cohort!r} (cohorts: {names}); fix: --seed-set {file}:COHORT[:SET]"
        )
    if chosen is None:
        if len(sets) != 1:
            names = ", ".join(str(s) for s in sets)
            raise SeedSetError(
                f"{file}: cohort {cohort!r} has sets {names}; fix: --seed-set {file}:{cohort}:SET"
            )
        chosen = str(next(iter(sets)))
    seeds = sets.get(chosen)
    if not isinstance(seeds, dict):
        names = ", ".join(str(s) for s in sets)
        raise SeedSetError(
            f"{file}: cohort {cohort!r} has no set {chosen!r} (sets: {names}); fix: one of them"
        )
    where = f"{file}: cohorts.{cohort}.{chosen}"
    missing = [k for k in SEED_KEYS if k not in seeds]
    if missing:
        raise SeedSetError(f"{where}: missing {', '.join(missing)}; fix: give all of {', '.join(SEED_KEYS)}")
    values = {k: _seed(seeds[k], f"{where}.{k}") for k in SEED_KEYS}
    return SeedSet(
        file=str(path.resolve()),
        sha256=hashlib.sha256(raw).hexdigest(),
        cohort=cohort,
        set=chosen,
        **values,
    )
