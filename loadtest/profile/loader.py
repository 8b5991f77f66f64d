"""Find, read and validate traffic profiles; errors name the file, the key path and the fix."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from loadtest.errors import UsageError
from loadtest.profile.errors import DOCS_HINT, format_validation_error
from loadtest.profile.schema import FLAT_KEYS, Profile, Scenario
from loadtest.tokens.tokenizer import TOKENIZER_ALIASES

SHIPPED_DIR = Path(__file__).resolve().parents[2] / "traffic_profiles"

__all__ = [
    "SHIPPED_DIR",
    "ProfileError",
    "format_validation_error",
    "load_profile",
    "parse_profile",
    "resolve_profile_path",
    "shipped_profiles",
]


class ProfileError(UsageError):
    """A profile that cannot be used; the message is meant for the user as is (bad input: exit 2)."""


def shipped_profiles() -> dict[str, Path]:
    """Names of the profiles in traffic_profiles/, with their paths."""
    if not SHIPPED_DIR.is_dir():
        return {}
    return {p.stem: p for p in sorted(SHIPPED_DIR.glob("*.yaml"))}


def resolve_profile_path(name_or_path: str) -> Path:
    """A shipped profile name, or a path to a YAML file."""
    p = Path(name_or_path)
    try:
        looks_like_path = p.suffix in (".yaml", ".yml") or p.exists() or "/" in name_or_path
        if looks_like_path and not p.is_file():
            raise ProfileError(f"{name_or_path}: no such profile file")
    except (OSError, ValueError) as e:
        raise ProfileError(f"{name_or_path}: cannot use this path ({e})") from e
    if looks_like_path:
        return p
    shipped = shipped_profiles()
    if name_or_path in shipped:
        return shipped[name_or_path]
    close = difflib.get_close_matches(name_or_path, list(shipped), n=3, cutoff=0.6)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    raise ProfileError(
        f"unknown profile {name_or_path!r}{hint}: use a file path or one of: "
        f"{', '.join(shipped) or '(none shipped)'}"
    )


MAX_PROFILE_BYTES = 4 * 2**20  # the largest shipped profile (an empirical trace table) is a few KB
MAX_NODES = 1_000_000  # values in the document once aliases are expanded (a billion-laughs bomb has 10^9)


def _expanded_size_over(data: Any, limit: int) -> bool:
    """Whether ``data`` holds more than ``limit`` values counting every alias use in full (a bounded walk:
    PyYAML shares aliased objects, so a small file can stand for an exponentially large document)."""
    stack, seen = [data], 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > limit:
            return True
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _read_yaml(path: Path) -> Any:
    try:
        size = path.stat().st_size
        if size > MAX_PROFILE_BYTES:
            raise ProfileError(
                f"{path}: {size / 2**20:.1f} MiB is not a profile (at most {MAX_PROFILE_BYTES // 2**20} MiB): "
                "large data such as traces goes in its own file, named by the profile"
            )
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ProfileError(f"{path}: cannot read the file ({e})") from e
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = " ".join(str(x) for x in (e.context, e.problem) if x) or "syntax error"
        raise ProfileError(f"{path}: not valid YAML{where}: {what}\n{DOCS_HINT}") from e
    except (yaml.YAMLError, RecursionError, ValueError, TypeError) as e:
        raise ProfileError(f"{path}: not valid YAML: {e}\n{DOCS_HINT}") from e
    if _expanded_size_over(data, MAX_NODES):
        raise ProfileError(
            f"{path}: its aliases (*name) expand to more than {MAX_NODES:,} values: refused as an expansion bomb"
        )
    return data


def parse_profile(data: Any, path: Path) -> Profile:
    """Validate already-parsed YAML ``data`` read from ``path``; relative trace paths resolve against its folder."""
    if data is None:
        raise ProfileError(
            f"{path}: the file is empty: a profile is a YAML mapping (name, load, scenarios, ...)\n{DOCS_HINT}"
        )
    if not isinstance(data, dict):
        raise ProfileError(
            f"{path}: the top level is a {type(data).__name__}: a profile is a YAML mapping "
            f"(name, load, scenarios, ...)\n{DOCS_HINT}"
        )
    try:
        profile = Profile.model_validate(data)
    except ValidationError as e:
        flat = FLAT_KEYS if "scenarios" not in data and any(k in data for k in FLAT_KEYS) else ()
        raise ProfileError(format_validation_error(path, e, Profile, flat)) from e
    except RecursionError as e:
        raise ProfileError(f"{path}: invalid profile: nested too deeply\n{DOCS_HINT}") from e
    trace = profile.load.trace
    if trace is not None:
        trace.path = str(_inside(path, trace.path, "load.trace.path"))
    for i, sc in enumerate(profile.scenarios):
        if sc.raw is not None:  # api: raw: the recorded bodies, relative to the profile like a trace
            sc.raw.file = str(_inside(path, sc.raw.file, f"scenarios[{i}].raw.file"))
        if sc.agent_trace is not None:  # recorded agent sessions, relative to the profile like a trace
            sc.agent_trace.path = str(_inside(path, sc.agent_trace.path, f"scenarios[{i}].agent_trace.path"))
        if sc.dataset is not None:  # a prompt dataset, relative to the profile like a trace
            sc.dataset.path = str(_inside(path, sc.dataset.path, f"scenarios[{i}].dataset.path"))
    if profile.tokenizer.lower() not in TOKENIZER_ALIASES:
        # not a bundled encoding: a tokenizer file or folder, found like a trace, inside the profile's folder
        profile.tokenizer = str(_inside(path, profile.tokenizer, "tokenizer"))
    return profile


def dataset_scenario(profile: Profile, path: Path, dataset: str) -> Scenario:
    """The one scenario `--dataset FILE` puts in place of the profile's: the file's prompts as they are
    written, its format read from its shape, output lengths from the file (docs/datasets.md)."""
    api = profile.api
    if api not in ("chat", "completions"):
        raise ProfileError(
            f"{path}: --dataset sends chat prompts, and this profile's api is {api}: "
            "use a chat profile (e.g. --profile interactive-chat)"
        )
    try:
        return Scenario.model_validate({"name": "dataset", "kind": "chat", "dataset": {"path": dataset}})
    except ValidationError as e:
        raise ProfileError(f"--dataset {dataset}: {e.errors()[0]['msg']}") from e


def _inside(profile_path: Path, ref: str, field: str) -> Path:
    """A file a profile names: absolute as given, relative against the profile's folder and inside it.

    A profile is data: a relative path may not climb out of its folder with ``..`` (an absolute path
    is the explicit way to name a file elsewhere).
    """
    p = Path(ref).expanduser()
    if p.is_absolute():
        return p.resolve()
    base = profile_path.parent.resolve()
    resolved = (base / p).resolve()
    if not resolved.is_relative_to(base):
        raise ProfileError(
            f"{profile_path}: {field}: {ref!r} leaves the profile's folder {base}: "
            "refer to files inside it, or give an absolute path"
        )
    return resolved


def load_profile(name_or_path: str) -> tuple[Profile, Path]:
    """Load and validate a profile; raises ProfileError with file, key path and what is allowed."""
    path = resolve_profile_path(name_or_path)
    return parse_profile(_read_yaml(path), path), path
