"""The API key: read from an environment variable or a file, never stored, redacted from every log line."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

REDACTED = "***"
_MIN_REDACT_LEN = 4  # shorter "keys" would blank out ordinary words


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
    return key


def load_api_key(env_name: str | None, file_path: str | None) -> str | None:
    """The key from the file (first) or the variable; None when neither is given."""
    if file_path:
        return read_key_file(file_path)
    if env_name:
        key = os.environ.get(env_name, "").strip()
        if not key:
            raise KeySourceError(f"the API key variable {env_name} is not set or empty on this host")
        return key
    return None


def redact(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with every secret (and its Bearer form) replaced by ***."""
    for s in secrets:
        if s and s in text:
            text = text.replace(s, REDACTED)
    return text


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
