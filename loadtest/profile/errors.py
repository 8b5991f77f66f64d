"""Turn pydantic validation errors into lines that name the key path, the problem and what is allowed."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from loadtest.profile.base import NAME_PATTERN

DOCS_HINT = "see docs/profiles.md"
SLO_KEY_HINT = "not an SLO key: use <metric>_p<percentile> (e.g. ttft_p99, tpot_p90, e2e_p99.9), error_rate, quality_min or conversation_attainment"


def _members(tp: Any) -> list[Any]:
    """Unwrap Annotated, Optional and unions into their concrete types."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _members(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(tp) for m in _members(a)]
    return [] if tp is type(None) else [tp]


def _is_model(tp: Any) -> bool:
    return inspect.isclass(tp) and issubclass(tp, BaseModel)


def _tag(model: type[BaseModel]) -> str | None:
    field = model.model_fields.get("dist")
    args = typing.get_args(field.annotation) if field else ()
    return args[0] if args else None


def walk(root: type[BaseModel], loc: tuple[Any, ...]) -> tuple[str, type[BaseModel] | None, list[str]]:
    """The key path of ``loc`` as users write it (``a.b[2].c``, union tags dropped), the model there, its dist tags."""
    cur: list[Any] = [root]
    parts: list[str] = []
    for el in loc:
        if el == "[key]":
            continue
        cands = [m for t in cur for m in _members(t)]
        models = [m for m in cands if _is_model(m)]
        if isinstance(el, str) and len(models) > 1 and any(_tag(m) == el for m in models):
            cur = [m for m in models if _tag(m) == el]
            continue
        if isinstance(el, int):
            parts.append(f"[{el}]")
            cur = [_item_type(c, el) for c in cands if typing.get_origin(c) in (list, tuple, dict)]
            continue
        parts.append(("." if parts else "") + str(el))
        fields = [m.model_fields[el].annotation for m in models if el in m.model_fields]
        dicts = [typing.get_args(c)[1] for c in cands if typing.get_origin(c) is dict]
        cur = fields or dicts
    models = [m for t in cur for m in _members(t) if _is_model(m)]
    return "".join(parts), (models[0] if len(models) == 1 else None), [t for m in models if (t := _tag(m))]


def _item_type(container: Any, index: int) -> Any:
    args = typing.get_args(container)
    if typing.get_origin(container) is dict:
        return args[1]
    if typing.get_origin(container) is tuple and len(args) > index and args[-1] is not Ellipsis:
        return args[index]
    return args[0] if args else Any


def _got(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _describe(item: Mapping[str, Any], allowed: list[str] | None) -> str:
    kind, msg, ctx = item["type"], item["msg"], item.get("ctx") or {}
    if kind == "missing":
        return "required item is missing" if isinstance(item["loc"][-1], int) else "required key is missing"
    if kind == "string_pattern_mismatch" and ctx.get("pattern") == NAME_PATTERN:
        return f"use letters, digits, _ . - only (got {_got(item['input'])})"
    if kind == "extra_forbidden":
        keys = ", ".join(allowed) if allowed else "none"
        return f"unknown key; allowed keys here: {keys}"
    if kind == "union_tag_invalid":
        return f"dist {ctx.get('tag')!r} is not one of: {ctx.get('expected_tags', '').replace(chr(39), '')}"
    if kind == "union_tag_not_found":
        return "needs a dist key: one of fixed, uniform, normal, lognormal, empirical"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        keys = f" (keys: {', '.join(allowed)})" if allowed else ""
        return f"expected a mapping{keys}, got {type(item['input']).__name__} {_got(item['input'])}"
    if kind == "value_error":
        return msg.removeprefix("Value error, ")
    if kind == "profile_rule":
        return msg
    return f"{msg[0].lower()}{msg[1:]} (got {_got(item['input'])})"


def format_validation_error(
    path: Path, err: ValidationError, root: type[BaseModel], flat_keys: tuple[str, ...] = ()
) -> str:
    """Every problem on its own line: ``key.path: what is wrong (what is allowed)``; flat profiles keep flat paths."""
    problems: list[str] = []
    for item in err.errors(include_url=False):
        loc = tuple(item["loc"]) + tuple((item.get("ctx") or {}).get("at", ()))
        key_path, _, tags = walk(root, loc)
        _, parent, _ = walk(root, loc[:-1] if item["type"] == "extra_forbidden" else loc)
        allowed = list(parent.model_fields) if parent is not None else None
        if tags and item["type"] in ("model_type", "model_attributes_type"):
            item = {
                **item,
                "type": "profile_rule",
                "msg": f"expected a mapping {{dist: {' | '.join(tags)}, ...}}, "
                f"got {type(item['input']).__name__} {_got(item['input'])}",
            }
        if flat_keys and loc[:2] == ("scenarios", 0):
            if loc[2:3] == ("name",):
                continue  # the flat form names its scenario after the profile: reported at name already
            key_path = key_path.removeprefix("scenarios[0]").lstrip(".")
            if allowed is not None and loc[:-1] == ("scenarios", 0):
                allowed = [k for k in allowed if k in flat_keys]
        elif flat_keys and allowed is not None and len(loc) <= 1 and parent is root:
            allowed = [k for k in allowed if k != "scenarios"] + list(flat_keys)
        if loc[-1:] == ("[key]",) and loc[:1] == ("slos",):
            item = {**item, "type": "profile_rule", "msg": SLO_KEY_HINT}
        line = f"  {key_path or '(top level)'}: {_describe(item, allowed)}"
        if line not in problems:
            problems.append(line)
    head = f"{path}: invalid profile ({len(problems)} problem{'s' if len(problems) != 1 else ''}):"
    return "\n".join([head, *problems, DOCS_HINT])
