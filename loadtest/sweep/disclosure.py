"""A submission's declarations from --endpoint-file (§8.2 system, system_power, the points' own fields) and what is missing."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from loadtest.sweep.rules import BENCHMARKS

COHORT = re.compile(r"\d{4}-\d{2}-C[01]")
SHORT_NAME_MAX = 20  # §8.2 shortened_system_name

# §8.2 system_desc.json fields a v1.0 bundle needs, with what each holds (the fix in the error)
SYSTEM_FIELDS = {
    "system_name": "the system's name",
    "submitter_org_names": "the submitting organisation",
    "division": "Standardized, Serviced or RDI",
    "system_availability_status": "Available, Preview or RDI",
    "max_supported_concurrency": "the declared C_max, above 32",
    "system_size": "a string, e.g. '1 node, 8 GPUs'",
    "system_node_ensemble_count": "an integer",
    "system_node_ensemble_total": "an integer",
    "shortened_system_name": f"at most {SHORT_NAME_MAX} characters",
    "serving_framework": "e.g. vLLM 0.11",
    "model_precision": "e.g. bf16",
    "link_to_model": "a URL",
    "dataset_name": "e.g. CNN/DailyMail",
    "dataset_type": "Performance, Accuracy or Accuracy + Performance",
    "dataset_link": "a URL",
    "node_types": "a list of node types",
}
NODE_FIELDS = {
    "system_node_ensemble_id": "an integer",
    "number_of_nodes": "an integer",
    "host_processor_model_name": "the CPU",
    "host_memory_configuration": "e.g. 16x 64GB DDR5",
    "host_network_card_count": "a string, e.g. '8x 400Gb'",
    "driver": "e.g. NVIDIA 570.86",
    "filesystem": "e.g. ext4",
    "accelerator_info": "a list of {accelerator_model_name, accelerators_per_node, ...}",
}
# fields of system_desc.json that are also a point.yaml disclosure (§8.3)
POINT_FROM_SYSTEM = (
    "division",
    "max_supported_concurrency",
    "model_precision",
    "link_to_model",
    "link_to_model_transformation",
    "model_notes",
    "dataset_name",
    "dataset_type",
    "dataset_link",
)
SUBMISSION_FIELDS = {
    "model_name": f"the benchmark model, one of {', '.join(sorted(BENCHMARKS))} ...",
    "target_cohort": "the publication cohort, YYYY-MM-C0 or YYYY-MM-C1",
}


@dataclass
class Declarations:
    """What the submitter declares in --endpoint-file: ``system:`` (system_desc.json), ``system_power:``
    (results/<system>/system_power.json) and ``submission:`` (each point.yaml's own fields)."""

    system: dict[str, Any] = field(default_factory=dict)
    system_power: dict[str, Any] = field(default_factory=dict)
    submission: dict[str, Any] = field(default_factory=dict)

    @property
    def c_max(self) -> int | None:
        value = self.system.get("max_supported_concurrency")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def model_name(self) -> str | None:
        value = self.submission.get("model_name")
        return str(value) if value else None

    @property
    def dataset(self) -> str | None:
        """point.yaml ``dataset``: declared, else the benchmark's (rules.BENCHMARKS)."""
        declared = self.submission.get("dataset")
        bench = BENCHMARKS.get(self.model_name or "")
        return str(declared) if declared else (bench.dataset if bench else None)


def _blank(value: object) -> bool:
    return value is None or (isinstance(value, str) and not value.strip()) or value == [] or value == {}


def missing(decl: Declarations, seed_set: str | None) -> list[str]:
    """Every declaration a v1.0 bundle needs that ``decl`` (and ``--seed-set``) lacks, as ``where (what)``."""
    out = [f"system.{k} ({what})" for k, what in SYSTEM_FIELDS.items() if _blank(decl.system.get(k))]
    status = str(decl.system.get("system_availability_status") or "").lower()
    if status == "available" and _blank(decl.system.get("availability_url")):
        out.append("system.availability_url (where the Available system can be bought or rented)")
    if status == "preview" and _blank(decl.system.get("target_availability_date")):
        out.append("system.target_availability_date (YYYY-MM-DD)")
    c_max = decl.c_max
    if not _blank(decl.system.get("max_supported_concurrency")) and (c_max is None or c_max <= 32):
        out.append("system.max_supported_concurrency (an integer above 32)")
    short = decl.system.get("shortened_system_name")
    if isinstance(short, str) and len(short) > SHORT_NAME_MAX:
        out.append(f"system.shortened_system_name (at most {SHORT_NAME_MAX} characters, not {len(short)})")
    nodes = decl.system.get("node_types")
    for i, node in enumerate(nodes if isinstance(nodes, list) else []):
        node = node if isinstance(node, Mapping) else {}
        out += [
            f"system.node_types[{i}].{k} ({what})" for k, what in NODE_FIELDS.items() if _blank(node.get(k))
        ]
        if _blank(node.get("host_processor_core_count")) and _blank(node.get("host_processor_vcpu_count")):
            out.append(f"system.node_types[{i}].host_processor_core_count (or host_processor_vcpu_count)")
    out += [
        f"submission.{k} ({what})" for k, what in SUBMISSION_FIELDS.items() if _blank(decl.submission.get(k))
    ]
    cohort = decl.submission.get("target_cohort")
    if isinstance(cohort, str) and not COHORT.fullmatch(cohort):
        out.append(f"submission.target_cohort ({cohort!r} is not YYYY-MM-C0 or YYYY-MM-C1)")
    if decl.dataset is None:
        out.append("submission.dataset (the benchmark's dataset id, e.g. cnn_dailymail)")
    if _blank(decl.system_power):
        out.append(
            "system_power (the §4.5.2 power descriptor: system_desc_id, cooling, node_sets, scale_out)"
        )
    if not seed_set:
        out.append("--seed-set FILE:COHORT[:SET] (the cohort's published MLCommons seed set)")
    return out


def missing_text(where: str, gaps: list[str]) -> str:
    """The one-line error for ``gaps``: names each missing declaration and the fix."""
    return (
        f"{where}: an MLPerf Endpoints v1.0 bundle needs {len(gaps)} more declaration"
        f"{'s' if len(gaps) != 1 else ''}: {'; '.join(gaps)}; fix: add them to --endpoint-file "
        "(system:, system_power:, submission:; docs/sweep.md, The submission bundle)"
    )


def system_desc(decl: Declarations, system_name: str) -> dict[str, Any]:
    """system_desc.json: the declared §8.2 fields as given (``system_size`` as the string §8.2 asks for)."""
    desc = {"system_name": system_name, **decl.system}
    if isinstance(desc.get("system_size"), int | float):
        desc["system_size"] = f"{desc['system_size']}"
    return desc
