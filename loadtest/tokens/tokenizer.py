"""Offline tokenizers, chat-template token counting, and finding a model's own tokenizer on this host."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import quicktok
from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from loadtest.tokens.assistant import AssistantCounter

# Tokenizer families bundled by quicktok (no download, works offline).
TOKENIZER_ALIASES: dict[str, str] = {
    "llama3": "llama3",
    "llama-3": "llama3",
    "cl100k": "cl100k_base",
    "cl100k_base": "cl100k_base",
    "o200k": "o200k_base",
    "o200k_base": "o200k_base",
    "o200k_harmony": "o200k_harmony",
    "qwen3": "qwen3",
}
DEFAULT_TOKENIZER = "llama3"


class Tokenizer:
    """An offline tokenizer with a chat-template token counter.

    ``name`` is a bundled encoding (``llama3``, ``cl100k``, ``o200k``, ``o200k_harmony``, ``qwen3``)
    or the path of a Hugging Face ``tokenizer.json`` or of a folder holding one. The folder's chat
    template, when it has one, is used for chat prompts: ``chat_template.jinja`` (what current
    transformers' ``save_pretrained`` writes), else ``chat_template.json``, else the
    ``chat_template`` of ``tokenizer_config.json`` (the older place); ``template_file`` says which.
    """

    def __init__(self, name: str = DEFAULT_TOKENIZER) -> None:
        key = TOKENIZER_ALIASES.get(name.lower())
        self._hf: Any = None
        self._template: Any = None
        self._special: dict[str, str] = {}
        self._assistant: AssistantCounter | None = None
        self.template_file: str | None = None
        # llama3 chat counts: the fixed part of every prompt and each role's tokens, counted once
        self._chat_fixed = 0
        self._role_tokens: dict[str, int] = {}
        if key is not None:
            self.name = key
            self._enc = quicktok.get_encoding(key)
            return
        path = Path(name).expanduser()
        if not path.exists():
            raise ValueError(
                f"unknown tokenizer {name!r}: use one of {sorted(set(TOKENIZER_ALIASES))} "
                "or the path of a tokenizer.json (or a folder holding one)"
            )
        self.name = str(path)
        self._load_hf(path)

    def _load_hf(self, path: Path) -> None:
        from tokenizers import Tokenizer as HfTokenizer

        folder = path if path.is_dir() else path.parent
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise ValueError(f"{path}: no tokenizer.json there")
        try:
            self._hf = HfTokenizer.from_file(str(file))
        except Exception as e:  # the library raises its own exception types
            raise ValueError(f"{file}: not a Hugging Face tokenizer.json ({e})") from e
        cfg = _read_json(folder / "tokenizer_config.json")
        specials = _read_json(folder / "special_tokens_map.json")
        for key in ("bos_token", "eos_token"):
            tok = cfg.get(key, specials.get(key))
            self._special[key] = tok.get("content", "") if isinstance(tok, dict) else str(tok or "")
        template, self.template_file = _chat_template(folder, cfg)
        if template is not None:
            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
            )
            env.globals["raise_exception"] = _raise_exception
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            try:
                self._template = env.from_string(template)
            except TemplateError as e:
                raise ValueError(
                    f"{folder / (self.template_file or '')}: the chat template does not parse ({e})"
                ) from e

    def count(self, text: str) -> int:
        """Tokens in plain text (no special tokens)."""
        if not text:
            return 0
        if self._hf is not None:
            return len(self._hf.encode(text, add_special_tokens=False).ids)
        return self._enc.count(text)

    def encode(self, text: str) -> list[int]:
        if self._hf is not None:
            return list(self._hf.encode(text, add_special_tokens=False).ids)
        return list(self._enc.encode_ordinary(text))

    def decode(self, ids: Sequence[int]) -> str:
        if self._hf is not None:
            return self._hf.decode(list(ids), skip_special_tokens=False)
        return self._enc.decode(list(ids))

    def render_chat(self, messages: Sequence[dict[str, Any]]) -> str:
        """The prompt string a Llama-3-style chat template produces, ending with the assistant header."""
        parts = ["<|begin_of_text|>"]
        for m in messages:
            content = _text_of(m.get("content"))
            parts.append(
                f"<|start_header_id|>{m.get('role', 'user')}<|end_header_id|>\n\n{content}<|eot_id|>"
            )
        parts.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
        return "".join(parts)

    def encode_chat(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """Token ids of the templated chat prompt: the tokenizer's own template (HF), the Llama-3 template,
        harmony for ``o200k_harmony`` (gpt-oss), or for other families a ChatML layout
        (``<|im_start|>role\\ncontent<|im_end|>``, special tokens where the encoding has them)."""
        if self._template is not None:
            return list(self._hf.encode(self._render_hf(messages), add_special_tokens=False).ids)
        if self.name != "llama3":
            text = _harmony(messages) if self.name == "o200k_harmony" else _chatml(messages)
            if self._hf is not None:
                return list(self._hf.encode(text, add_special_tokens=False).ids)
            return list(self._enc.encode(text, allowed_special="all"))
        enc = self._enc
        special = enc.encode_single_token
        begin, start, end, eot = (
            special(t)
            for t in ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
        )
        ids = [begin]
        for m in messages:
            ids.append(start)
            ids += enc.encode_ordinary(str(m.get("role", "user")))
            ids.append(end)
            ids += enc.encode_ordinary("\n\n" + _text_of(m.get("content")))
            ids.append(eot)
        ids += [start, *enc.encode_ordinary("assistant"), end, *enc.encode_ordinary("\n\n")]
        return ids

    def encode_request(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        """Prompt ids of a chat request, tools included where chat templates render them
        (``tools_in_place``): the tool definitions' JSON at the head of the first user message, each
        assistant tool call's JSON in its own message. The workload counts prompts and the embedded
        engine prefills them with this same function."""
        placed, rest = tools_in_place(messages, tools)
        ids = self.encode_chat(placed)
        return ids + self.encode(rest) if rest else ids

    def count_request(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> int:
        """``len(encode_request(...))`` without building the ids."""
        placed, rest = tools_in_place(messages, tools)
        return self.count_chat(placed) + (self.count(rest) if rest else 0)

    def count_chat(self, messages: Sequence[dict[str, Any]]) -> int:
        """Prompt tokens of a chat request: the templated prompt, special tokens included.

        Special tokens split the prompt into ordinary segments that tokenize independently, so the
        count is the specials plus each segment's count (equal to encoding ``render_chat``; tested).
        """
        if self._template is not None:
            return len(self._hf.encode(self._render_hf(messages), add_special_tokens=False).ids)
        if self.name == "llama3":
            if not self._chat_fixed:  # begin, final header
                self._chat_fixed = 1 + 2 + self.count("assistant") + self.count("\n\n")
            n = self._chat_fixed
            roles = self._role_tokens
            for m in messages:
                role = str(m.get("role", "user"))
                role_n = roles.get(role)
                if role_n is None:
                    role_n = self.count(role)
                    if len(roles) < 64:  # a few roles in practice; a dataset's odd ones stay uncached
                        roles[role] = role_n
                n += 3 + role_n + self.count("\n\n" + _text_of(m.get("content")))
            return n
        return len(self.encode_chat(messages))

    def _render_hf(self, messages: Sequence[dict[str, Any]]) -> str:
        return self._template.render(messages=list(messages), add_generation_prompt=True, **self._special)

    @property
    def bundled(self) -> bool:
        """Whether this is a bundled encoding, whose pre-tokenizer splits text before every word with a
        leading space (tiktoken's patterns): no token spans two such words."""
        return self._hf is None

    @property
    def has_template(self) -> bool:
        """Whether this tokenizer came with the model's own chat template (an HF folder that has one)."""
        return self._template is not None

    def count_rendered(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool) -> int:
        """Tokens of the messages rendered through the model's own chat template (``has_template`` must be
        true); a template that refuses them raises ``jinja2.TemplateError``."""
        text = self._template.render(
            messages=list(messages), add_generation_prompt=add_generation_prompt, **self._special
        )
        return len(self._hf.encode(text, add_special_tokens=False).ids)

    @property
    def assistant(self) -> AssistantCounter:
        """The MLPerf Endpoints counter of an answer's tokens through this tokenizer's chat template."""
        counter = self._assistant
        if counter is None:
            counter = self._assistant = AssistantCounter(self)
        return counter


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object file's content, {} when the file is absent."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e})") from e
    return data if isinstance(data, dict) else {}


def _chat_template(folder: Path, cfg: dict[str, Any]) -> tuple[str | None, str | None]:
    """The folder's chat template and the file it came from: chat_template.jinja, chat_template.json,
    then tokenizer_config.json's ``chat_template`` (a string, or named templates: the default one)."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8"), jinja.name
    for name, doc in (
        ("chat_template.json", _read_json(folder / "chat_template.json")),
        ("tokenizer_config.json", cfg),
    ):
        template = doc.get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        if isinstance(template, str):
            return template, name
    return None, None


def _raise_exception(message: str) -> None:
    """What HF chat templates call on input they refuse."""
    raise TemplateError(message)


def _chatml(messages: Sequence[dict[str, Any]]) -> str:
    """The ChatML layout used for families without a template of their own here."""
    parts = [
        f"<|im_start|>{m.get('role', 'user')}\n{_text_of(m.get('content'))}<|im_end|>\n" for m in messages
    ]
    return "".join(parts) + "<|im_start|>assistant\n"


def _harmony(messages: Sequence[dict[str, Any]]) -> str:
    """OpenAI's harmony layout (gpt-oss), whose markers are special tokens of ``o200k_harmony``."""
    parts = [
        f"<|start|>{m.get('role', 'user')}<|message|>{_text_of(m.get('content'))}<|end|>" for m in messages
    ]
    return "".join(parts) + "<|start|>assistant"


def tools_in_place(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None
) -> tuple[list[dict[str, Any]], str]:
    """The messages with tools rendered where chat templates put them, as JSON text (``json.dumps``,
    key order kept); Llama 3.1's template puts the tool definitions at the head of the first user
    message and each tool call in its assistant message (docs/sources.md §7). So a conversation's
    prompt grows at its end only and a prefix cache keeps the tools. Returns the messages and the
    tools' text no user message took ("" when placed)."""
    tools_text = json.dumps(list(tools)) if tools else ""
    out: list[dict[str, Any]] = []
    for m in messages:
        if calls := m.get("tool_calls"):
            m = {k: v for k, v in m.items() if k != "tool_calls"}
            m["content"] = _text_of(m.get("content")) + json.dumps(list(calls))
        elif tools_text and m.get("role") == "user":
            m = {**m, "content": tools_text + "\n\n" + _text_of(m.get("content"))}
            tools_text = ""
        out.append(m)
    return out, tools_text


def _text_of(content: Any) -> str:
    """A message's text: a string, or the text parts of a content-part list."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content or "")


@lru_cache(maxsize=8)
def get_tokenizer(name: str = DEFAULT_TOKENIZER) -> Tokenizer:
    """A shared tokenizer instance per name."""
    return Tokenizer(name)


# ---- which tokenizer a run uses: the model's own when this host has it, else a named family ----

# Bundled family -> model ids it is the real tokenizer of (case-insensitive search in the served id).
_FAMILIES: tuple[tuple[str, str], ...] = (
    ("o200k_harmony", r"gpt-oss"),
    ("llama3", r"llama[-_ ]?3"),
    ("qwen3", r"qwen[-_ ]?3"),
    ("o200k_base", r"gpt-4o|gpt-4\.1|gpt-5|(^|/)o[134](-|$)"),
    ("cl100k_base", r"gpt-4(?!o|\.)|gpt-3\.5"),
)


def bundled_family(model: str | None) -> str | None:
    """The bundled encoding that is ``model``'s own tokenizer, judged by its name (None: not known)."""
    for key, pattern in _FAMILIES:
        if model and re.search(pattern, model, re.IGNORECASE):
            return key
    return None


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache folder: $HF_HUB_CACHE, $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return cache / "huggingface" / "hub"


@dataclass(frozen=True)
class FoundTokenizer:
    """A model's own tokenizer on this host: the folder holding its tokenizer.json, and how it was found."""

    path: str
    how: str  # "model_folder" (the served id is a folder here) or "hf_cache"
    repo: str | None = None  # the Hugging Face repository id, for the cache


def find_model_tokenizer(model: str | None, hub: Path | None = None) -> FoundTokenizer | None:
    """The served model's own tokenizer, from local files only (never a download).

    ``model`` is the id the server serves (``/v1/models``): vLLM and llama.cpp started with
    ``--model /path/to/dir`` serve that path, so a folder here (or a file such as a .gguf in one)
    holding ``tokenizer.json`` is used; otherwise the Hugging Face cache is searched for the
    repository ``ORG/NAME`` (also from a path that holds ``models--ORG--NAME``), or for the one
    cached repository whose name equals the id's last part (case-insensitive).
    """
    if not model:
        return None
    local = Path(model).expanduser()
    for folder in (local, local.parent) if local.is_file() else (local,):
        if folder.is_dir() and (folder / "tokenizer.json").is_file():
            return FoundTokenizer(str(folder.resolve()), "model_folder")
    hub = hf_hub_cache() if hub is None else hub
    if not hub.is_dir():
        return None
    cached = {d.name.lower(): d for d in hub.iterdir() if d.name.startswith("models--") and d.is_dir()}
    m = re.search(r"models--([^/\\]+?)--([^/\\]+)", model)
    repo = f"{m.group(1)}/{m.group(2)}" if m else model if re.fullmatch(r"[\w.-]+/[\w.-]+", model) else None
    if repo is not None:
        repo_dir = cached.get("models--" + repo.replace("/", "--").lower())
    else:  # a served name or a path on the server's host: its last part, when exactly one repo has that name
        name = re.split(r"[/\\]", model.rstrip("/\\"))[-1].lower()
        hits = [d for key, d in cached.items() if key.split("--", 2)[-1] == name]
        repo_dir = hits[0] if len(hits) == 1 else None
    snapshot = _snapshot_with_tokenizer(repo_dir) if repo_dir is not None else None
    if snapshot is None:
        return None
    repo_id = "/".join(repo_dir.name.split("--", 2)[1:]) if repo_dir is not None else None
    return FoundTokenizer(str(snapshot), "hf_cache", repo_id)


def _snapshot_with_tokenizer(repo_folder: Path) -> Path | None:
    """The cached snapshot holding tokenizer.json: the one refs/main names, else the newest."""
    snapshots = repo_folder / "snapshots"
    ref = repo_folder / "refs" / "main"
    if ref.is_file():
        main = snapshots / ref.read_text().strip()
        if (main / "tokenizer.json").is_file():
            return main
    found = [d for d in snapshots.glob("*") if (d / "tokenizer.json").is_file()] if snapshots.is_dir() else []
    return max(found, key=lambda d: d.stat().st_mtime) if found else None


@dataclass(frozen=True)
class TokenizerChoice:
    """The client tokenizer of a run and why it is that one (run.json's ``tokens.tokenizer``)."""

    name: str  # a bundled name or a tokenizer folder / file
    source: str  # option | profile | model_folder | hf_cache | engine | family | guess
    detail: str  # one line for people

    @property
    def guessed(self) -> bool:
        """True when nothing says this is the served model's tokenizer."""
        return self.source == "guess"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "guessed": self.guessed}


def choose_tokenizer(
    *,
    option: str | None,
    profile_tokenizer: str,
    model: str | None,
    engine_tokenizer: str | None = None,
    profile_sets_it: bool = True,
    hub: Path | None = None,
) -> TokenizerChoice:
    """The client tokenizer, best evidence first: ``--tokenizer``; the profile's tokenizer file; for the
    embedded engine its own; the served model's own from this host's files (``find_model_tokenizer``);
    the profile's bundled family when the model's name is of that family; else that family, a guess."""
    if option:
        return TokenizerChoice(option, "option", f"{option}, given by --tokenizer")
    family = TOKENIZER_ALIASES.get(profile_tokenizer.lower())
    if family is None:
        return TokenizerChoice(
            profile_tokenizer, "profile", f"{profile_tokenizer}, the profile's tokenizer file"
        )
    if engine_tokenizer is not None:
        engine_family = TOKENIZER_ALIASES.get(engine_tokenizer.lower(), engine_tokenizer)
        if engine_family == family or not profile_sets_it:
            return TokenizerChoice(engine_family, "engine", f"{engine_family}, the embedded engine's own")
        return TokenizerChoice(
            family, "profile", f"{family}, the profile's (the embedded engine counts with {engine_family})"
        )
    found = find_model_tokenizer(model, hub)
    if found is not None:
        where = (
            f"the served model id {model} is this folder"
            if found.how == "model_folder"
            else f"the Hugging Face cache holds {found.repo}"
        )
        return TokenizerChoice(found.path, found.how, f"{found.path}, the model's own ({where})")
    if model and bundled_family(model) == family:
        return TokenizerChoice(family, "family", f"bundled {family}, the tokenizer family of {model}")
    return TokenizerChoice(
        family,
        "guess",
        f"bundled {family}, a guess: model {model or '(unknown)'}'s own tokenizer is not on this host "
        f"(no such folder; not in the Hugging Face cache {hf_hub_cache() if hub is None else hub})",
    )
