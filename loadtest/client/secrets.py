"""The API key: read from an environment variable or a file, never stored, redacted from every log line."""

from __future__ import annotations

import logging
import os
import re
from functools import lru_cache
from pathlib import Path

REDACTED = "***"
_MIN_REDACT_LEN = 4  # shorter "keys" would blank out ordinary words
# Any run of this many consecutive characters of a key is redacted wherever it appears (a server that
# echoes part of it, e.g. what follows a space); shorter keys are redacted whole only.
FRAGMENT_LEN = 6


class KeySourceError(ValueError):
    """The key's variable or file is missing or empty; the message is one line for the user."""


def read_key_file(path: str) -> str:
    """The key in ``path`` (surrounding whitespace dropped); KeySourceError if unreadable or empty."""
    try:
        key = Path(path).expanduser().read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise KeySourceError(
            f"--api-key-file {path}: cannot read it ({getattr(e, 'strerror', None) or e})"
        ) from e
    if not key:
        raise KeySourceError(f"--api-key-file {path}: the file is empty")
    if "\n" in key:
        raise KeySourceError(f"--api-key-file {path}: the file must hold the key alone on one line")
    check_sendable(key, f"--api-key-file {path}")
    return key


def check_sendable(key: str, where: str) -> None:
    """KeySourceError (naming ``where`` the key came from, never the key) unless the key can be sent in an
    HTTP header: Latin-1 characters only (RFC 9110 field values), no control character."""
    for i, ch in enumerate(key, 1):
        code = ord(ch)
        kind = (
            "a non-Latin-1 character"
            if code > 0xFF
            else "a control character"
            if code < 32 or code == 127
            else ""
        )
        if kind:
            raise KeySourceError(
                f"{where}: the key holds {kind} (character {i}), which cannot be sent in an HTTP header; "
                "set it to the key exactly as issued (look for a pasted quote, accent, tab or line break)"
            )


def load_api_key(env_name: str | None, file_path: str | None) -> str | None:
    """The key from the file (first) or the variable; None when neither is given."""
    if file_path:
        return read_key_file(file_path)
    if env_name:
        key = os.environ.get(env_name, "").strip()
        if not key:
            raise KeySourceError(f"the API key variable {env_name} is not set or empty on this host")
        check_sendable(key, f"the API key variable {env_name}")
        return key
    return None


def redact(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with every secret replaced by ***, and every run of FRAGMENT_LEN or more consecutive
    characters of one (a part of it a server echoed) too."""
    for s in secrets:
        if not s:
            continue
        fragments = _fragments(s)
        if fragments is None:
            if s in text:
                text = text.replace(s, REDACTED)
            continue
        if fragments.search(text) is None:
            continue
        spans: list[list[int]] = []
        for m in fragments.finditer(text):
            start = m.start()
            if spans and start <= spans[-1][1]:
                spans[-1][1] = start + FRAGMENT_LEN
            else:
                spans.append([start, start + FRAGMENT_LEN])
        parts, at = [], 0
        for start, end in spans:
            parts += [text[at:start], REDACTED]
            at = end
        parts.append(text[at:])
        text = "".join(parts)
    return text


@lru_cache(maxsize=32)
def _fragments(secret: str) -> re.Pattern[str] | None:
    """One pattern finding, at every position, whether a FRAGMENT_LEN-character part of ``secret`` starts
    there (a lookahead, so overlapping parts are all found); built once per secret. None: too short."""
    if len(secret) < FRAGMENT_LEN:
        return None
    parts = sorted({secret[i : i + FRAGMENT_LEN] for i in range(len(secret) - FRAGMENT_LEN + 1)})
    return re.compile("(?=(?:" + "|".join(map(re.escape, parts)) + "))")


# Credentials a server may echo that this process was not told about: a bearer token, an OpenAI-style key.
_BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{4,}")
_KEY_LIKE = re.compile(r"\bsk-[A-Za-z0-9_-]{6,}")
_SNIPPET_PAD = 512  # bytes decoded past the cut, so a secret that straddles it is still whole when redacted


def redact_echoes(text: str, secrets: tuple[str, ...] = ()) -> str:
    """``text`` without the given and known secrets, nor anything that looks like a bearer token or key."""
    text = redact(text, tuple(secrets) + _Redactor.secrets)
    return _KEY_LIKE.sub(REDACTED, _BEARER.sub(rf"\g<1>{REDACTED}", text))


def snippet(body: bytes, n: int = 160) -> str:
    """The start of a response body for an error message: redacted first, then cut to ``n`` characters."""
    head = body[: n + _SNIPPET_PAD]
    text = redact_echoes(head.decode("utf-8", "replace").replace("\n", " ").strip())
    return text[:n] + ("…" if len(text) > n or len(body) > len(head) else "")


_formatter = logging.Formatter()


class _Redactor:
    """Secrets this process knows; a log-record factory that removes them from every message."""

    secrets: tuple[str, ...] = ()
    installed = False


def install_redaction(*secrets: str | None) -> None:
    """From now on, no log record of this process (any logger, any handler) can carry these secrets.

    The record factory formats each record's message once and removes the secrets from it (and from
    any exception text), so the filter applies however the record is later handled.
    """
    new = tuple(s for s in secrets if s and len(s) >= _MIN_REDACT_LEN)
    _Redactor.secrets = tuple(dict.fromkeys(_Redactor.secrets + new))
    if _Redactor.installed:
        return
    _Redactor.installed = True
    base = logging.getLogRecordFactory()

    def factory(*args: object, **kwargs: object) -> logging.LogRecord:
        record = base(*args, **kwargs)
        if _Redactor.secrets:
            try:
                msg = record.getMessage()
            except Exception:  # noqa: BLE001 - a bad format string is logging's problem, not ours
                return record
            clean = redact(msg, _Redactor.secrets)
            if clean != msg:
                record.msg, record.args = clean, None
            if record.exc_info:
                record.exc_text = redact(_formatter.formatException(record.exc_info), _Redactor.secrets)
        return record

    logging.setLogRecordFactory(factory)


def known_secrets() -> tuple[str, ...]:
    """The secrets redaction was installed for (to clean texts that do not go through logging)."""
    return _Redactor.secrets
