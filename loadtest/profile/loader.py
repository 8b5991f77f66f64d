"""Find, read and validate traffic profiles; errors name the file, the key path and the fix."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from loadtest.profile.schema import Profile

SHIPPED_DIR = Path(__file__).resolve().parents[2] / "traffic_profiles"


class ProfileError(Exception):
    """A profile that cannot be used; the message is meant for the user as is."""


def shipped_profiles() -> dict[str, Path]:
    """Names of the profiles in traffic_profiles/, with their paths."""
    if not SHIPPED_DIR.is_dir():
        return {}
    return {p.stem: p for p in sorted(SHIPPED_DIR.glob("*.yaml"))}


def resolve_profile_path(name_or_path: str) -> Path:
    """A shipped profile name, or a path to a YAML file."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists() or "/" in name_or_path:
        if not p.is_file():
            raise ProfileError(f"{name_or_path}: no such profile file")
        return p
    shipped = shipped_profiles()
    if name_or_path in shipped:
        return shipped[name_or_path]
    raise ProfileError(
        f"unknown profile {name_or_path!r}: use a file path or one of: {', '.join(shipped) or '(none shipped)'}"
    )


def load_profile(name_or_path: str) -> tuple[Profile, Path]:
    """Load and validate a profile; raises ProfileError with file, key path and what is allowed."""
    path = resolve_profile_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ProfileError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: a profile is a YAML mapping of fields (see docs/profiles.md)")
    try:
        return Profile.model_validate(data), path
    except ValidationError as e:
        raise ProfileError(format_validation_error(path, e)) from e


def format_validation_error(path: Path, err: ValidationError) -> str:
    lines = [f"{path}: invalid profile ({err.error_count()} problem(s)):"]
    for item in err.errors():
        loc = ".".join(str(x) for x in item["loc"] if not (isinstance(x, str) and x in _UNION_TAGS))
        lines.append(f"  {loc or '(top level)'}: {item['msg']}")
    lines.append("  see docs/profiles.md for every field and its allowed values")
    return "\n".join(lines)


_UNION_TAGS = {"fixed", "uniform", "normal", "lognormal"}
