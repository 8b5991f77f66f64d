"""Reading prompt datasets (ShareGPT JSON, OpenAI-chat JSONL, prompt tables, saved HF datasets) into turns."""

from __future__ import annotations

import csv
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# ShareGPT's speaker names (and the chat API's) as chat roles.
_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "system": "system",
}
_SHAPE_COLUMN = {"sharegpt": "conversations", "openai_chat": "messages", "prompts": "prompt"}
_FORMATS = "sharegpt, openai_chat, prompts, hf_disk"


class DatasetError(ValueError):
    """A dataset that cannot be used: the message names the profile field, the file and the fix."""


@dataclass(frozen=True, slots=True)
class Turn:
    """One request of a conversation: the earlier messages, the user's prompt, what the dataset says of the answer."""

    row: int  # 1-based row (conversation, line) of the source
    history: tuple[dict[str, str], ...]
    prompt: str
    reference: str | None = None
    output_tokens: int | None = None  # the source's output_tokens column


@dataclass(frozen=True, slots=True)
class Source:
    """A dataset read: its conversations (each one or more turns) and the sha256 of its content."""

    conversations: list[list[Turn]]
    sha256: str
    has_output_column: bool


def read_source(path: Path, fmt: str, columns: dict[str, str], where: str) -> Source:
    """The turns of the dataset at ``path``; DatasetError names ``where`` (``scenarios[i].dataset``)."""
    if not path.exists():
        raise DatasetError(
            f"{where}.path: {path}: no such file or folder: check the path (a relative one is "
            "from the profile's folder)"
        )
    rows, digest = _rows(path, fmt, where)
    rows = [{columns.get(k, k): v for k, v in r.items()} for r in rows]
    if not rows:
        raise DatasetError(f"{where}.path: {path}: the dataset has no rows: give a file with prompts in it")
    shape = _shape(rows[0], fmt, path, where)
    convs = [c for n, r in enumerate(rows, 1) if (c := _turns(r, shape, n, path, where))]
    has_out = any(t.output_tokens is not None for c in convs for t in c)
    return Source(convs, digest, has_out)


def _rows(path: Path, fmt: str, where: str) -> tuple[list[dict[str, Any]], str]:
    if path.is_dir():
        if fmt not in ("auto", "hf_disk"):
            raise DatasetError(
                f"{where}.format: {path} is a folder: format {fmt} reads a file (hf_disk a folder)"
            )
        return _hf_disk(path, where)
    if fmt == "hf_disk":
        raise DatasetError(
            f"{where}.format: {path} is a file: hf_disk reads the folder datasets' save_to_disk wrote"
        )
    data = _read_bytes(path, where)
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            return _parquet(path), hashlib.sha256(data).hexdigest()
        if suffix == ".csv":
            return _csv(data.decode("utf-8-sig")), hashlib.sha256(data).hexdigest()
        if suffix in (".json", ".jsonl", ".ndjson") or fmt in ("sharegpt", "openai_chat"):
            return _json_rows(data.decode("utf-8-sig"), path, where), hashlib.sha256(data).hexdigest()
    except (UnicodeDecodeError, OSError, ValueError) as e:
        if isinstance(e, DatasetError):
            raise
        raise DatasetError(f"{where}.path: {path}: cannot read it ({e})") from e
    raise DatasetError(
        f"{where}.format: cannot tell the format of {path} from its name: use a .json, .jsonl, .csv or "
        f".parquet file, or give format ({_FORMATS})"
    )


def _read_bytes(path: Path, where: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise DatasetError(f"{where}.path: {path}: cannot read it ({e})") from e


def _parquet(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return list(pq.read_table(path).to_pylist())


def _csv(text: str) -> list[dict[str, Any]]:
    return [dict(r) for r in csv.DictReader(text.splitlines())]


def _json_rows(text: str, path: Path, where: str) -> list[dict[str, Any]]:
    """A JSON array of objects, or one JSON object a line."""
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except ValueError as e:
            raise DatasetError(f"{where}.path: {path}: not valid JSON ({e})") from None
        rows = data
    else:
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as e:
                    raise DatasetError(f"{where}.path: {path}: line {n} is not JSON ({e})") from None
    for n, r in enumerate(rows, 1):
        if not isinstance(r, dict):
            raise DatasetError(f"{where}.path: {path}: row {n} is not a JSON object (one record per row)")
    return rows


def _hf_disk(folder: Path, where: str) -> tuple[list[dict[str, Any]], str]:
    """A ``Dataset.save_to_disk`` folder: its Arrow stream files, in state.json's order."""
    import pyarrow as pa

    if (folder / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in folder.iterdir() if p.is_dir())
        raise DatasetError(
            f"{where}.path: {folder} holds several splits ({', '.join(splits)}): name one split's folder, "
            f"e.g. {folder / (splits[0] if splits else 'train')}"
        )
    files = _arrow_files(folder)
    if not files:
        raise DatasetError(f"{where}.path: {folder}: no .arrow files: not a datasets save_to_disk folder")
    h, rows = hashlib.sha256(), []
    for f in files:
        data = _read_bytes(f, where)
        h.update(data)
        try:
            rows += pa.ipc.open_stream(pa.py_buffer(data)).read_all().to_pylist()
        except pa.ArrowInvalid as e:
            raise DatasetError(f"{where}.path: {f}: not an Arrow stream file ({e})") from e
    return rows, h.hexdigest()


def _arrow_files(folder: Path) -> list[Path]:
    state = folder / "state.json"
    if state.is_file():
        try:
            names = [d["filename"] for d in json.loads(state.read_text(encoding="utf-8"))["_data_files"]]
            return [folder / n for n in names]
        except (ValueError, KeyError, TypeError):
            pass
    return sorted(folder.glob("*.arrow"))


def _shape(first: dict[str, Any], fmt: str, path: Path, where: str) -> str:
    """Which record shape the rows have: the format's column, or (auto) the first one present."""
    wanted = [fmt] if fmt in _SHAPE_COLUMN else [s for s, col in _SHAPE_COLUMN.items() if col in first]
    if not wanted or _SHAPE_COLUMN[wanted[0]] not in first:
        need = _SHAPE_COLUMN.get(fmt, "conversations, messages or prompt")
        found = ", ".join(map(str, first)) or "none"
        raise DatasetError(
            f"{where}.columns: {path} has no {need} column (its columns: {found}): map yours with "
            f"columns, e.g. {{{next(iter(first), 'question')}: {_SHAPE_COLUMN.get(fmt, 'prompt')}}}"
        )
    return wanted[0]


def _turns(row: dict[str, Any], shape: str, n: int, path: Path, where: str) -> list[Turn]:
    out = _output_value(row.get("output_tokens"), n, path, where)
    ref = row.get("reference")
    ref = ref if isinstance(ref, str) and ref else None
    if shape == "prompts":
        prompt = row.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise DatasetError(f"{where}.columns: {path}: row {n} has no prompt text: every row needs one")
        return [Turn(n, (), prompt, ref, out)]
    key = _SHAPE_COLUMN[shape]
    msgs = _messages(row.get(key), n, key, path, where)
    if shape == "sharegpt":
        return [
            Turn(n, tuple(msgs[:k]), m["content"], _next_answer(msgs, k), None)
            for k, m in enumerate(msgs)
            if m["role"] == "user"
        ]
    users = [k for k, m in enumerate(msgs) if m["role"] == "user"]
    if not users:
        return []
    k = users[-1]
    return [Turn(n, tuple(msgs[:k]), msgs[k]["content"], ref or _next_answer(msgs, k), out)]


def _next_answer(msgs: list[dict[str, str]], k: int) -> str | None:
    nxt = msgs[k + 1] if k + 1 < len(msgs) else None
    return nxt["content"] if nxt is not None and nxt["role"] == "assistant" and nxt["content"] else None


def _messages(value: Any, n: int, key: str, path: Path, where: str) -> list[dict[str, str]]:
    """A conversation as chat messages (``{from, value}`` or ``{role, content}`` turns)."""
    if not isinstance(value, list):
        raise DatasetError(f"{where}.columns: {path}: row {n}: {key} is not a list of turns")
    msgs = []
    for m in value:
        role = _ROLES.get(str(m.get("from", m.get("role", ""))).lower()) if isinstance(m, dict) else None
        if role is None:
            raise DatasetError(
                f"{where}.path: {path}: row {n}: a turn of {key} has no known speaker "
                f"(from/role: {', '.join(sorted(_ROLES))})"
            )
        msgs.append({"role": role, "content": _text(m.get("value", m.get("content")))})
    return msgs


def _text(content: Any) -> str:
    """A turn's text: a string, or the text parts of a content-part list."""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _output_value(value: Any, n: int, path: Path, where: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        v = int(value)
    except (TypeError, ValueError):
        v = 0
    if v < 1 or (isinstance(value, float) and not value.is_integer()):
        raise DatasetError(
            f"{where}.columns: {path}: row {n}: output_tokens {value!r} is not a whole number ≥ 1"
        )
    return v
