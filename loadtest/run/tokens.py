"""Which tokenizer a run counts with and which token count its figures use, said at the start and in run.json."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from loadtest.locust.settings import RunSettings
from loadtest.profile.schema import Profile
from loadtest.sim.presets import get_model
from loadtest.tokens.tokenizer import TokenizerChoice, choose_tokenizer
from loadtest.workload.builder import Workload

# How each tokenizer source relates to the served model (TokenizerChoice.source).
_KINDS = {
    "model_folder": "the model's own",
    "hf_cache": "the model's own",
    "engine": "the embedded engine's own",
    "family": "the model's family",
    "option": "given by --tokenizer",
    "profile": "the profile's",
}


def _engine_tokenizer(engine_info: dict[str, Any] | None) -> str | None:
    """The embedded engine's own tokenizer (its model preset's), when the run started one."""
    if engine_info is None:
        return None

    try:
        return get_model(str(engine_info.get("model") or "")).tokenizer
    except (KeyError, ValueError):
        return None


def run_tokenizer_choice(
    settings: RunSettings, profile: Profile, model: str | None, engine_info: dict[str, Any] | None
) -> TokenizerChoice:
    """The tokenizer this run should use (``choose_tokenizer`` with the run's facts)."""
    return choose_tokenizer(
        option=settings.tokenizer,
        profile_tokenizer=profile.tokenizer,
        model=model,
        engine_tokenizer=_engine_tokenizer(engine_info),
        profile_sets_it="tokenizer" in profile.model_fields_set,
    )


def settle_tokenizer(
    settings: RunSettings,
    profile: Profile,
    workload: Workload,
    model: str | None,
    engine_info: dict[str, Any] | None,
) -> tuple[Profile, Workload]:
    """Once the served model is known: switch to its own tokenizer when this host has it (a folder the
    model id names, the Hugging Face cache), and say so; warn loudly when the tokenizer is a guess.

    The choice travels in ``settings`` (``tokenizer`` for every worker, ``tokenizer_source`` for run.json).
    """
    choice = run_tokenizer_choice(settings, profile, model, engine_info)
    if choice.name != profile.tokenizer:
        try:
            new_profile = profile.model_copy(update={"tokenizer": choice.name})
            new_workload = settings.workload(new_profile)
        except (ValueError, OSError) as e:
            print(
                f"loadtest: warning: the model's own tokenizer at {choice.name} does not load ({e}); "
                f"counting with {profile.tokenizer}, a guess",
                file=sys.stderr,
                flush=True,
            )
            choice = TokenizerChoice(profile.tokenizer, "guess", f"bundled {profile.tokenizer}, a guess")
        else:
            profile, workload = new_profile, new_workload
            settings.tokenizer = choice.name
    settings.tokenizer_source = choice.to_dict()
    if choice.source in ("model_folder", "hf_cache"):
        print(f"tokenizer: {choice.detail}", flush=True)
    elif choice.guessed:
        print(f"loadtest: warning: {guess_warning(choice)}", file=sys.stderr, flush=True)
    return profile, workload


def guess_warning(choice: TokenizerChoice) -> str:
    """The start-of-run warning for a guessed tokenizer."""
    return (
        f"tokenizer {choice.detail}. Prompt lengths are built with it, and where the server sends no "
        "usage, output tokens, TPOT and tokens/s are counted with it too (10-20 % off for another "
        "model's tokenizer): give --tokenizer DIR (a folder with tokenizer.json, e.g. the model's folder)"
    )


def tokens_section(
    metrics: Mapping[str, Any], settings: RunSettings, workload: Workload
) -> tuple[dict[str, Any], str | None]:
    """run.json's ``tokens`` from the whole run's ``metrics``: which count the figures use and which
    tokenizer; and the note when that count is the client tokenizer's and the tokenizer is a guess
    (docs/run-json.md, docs/metrics.md)."""
    src = settings.tokenizer_source or {
        "name": workload.tokenizer.name,
        "source": "profile",
        "detail": f"{workload.tokenizer.name}, the profile's",
        "guessed": False,
    }
    tok = metrics["tokens"]
    ok = metrics["requests"]["ok"]
    missing = ok - int(tok.get("usage_reports") or 0)
    counted_by = tok.get("counted_by")
    name = workload.tokenizer.name
    kind = "a guess" if src.get("guessed") else _KINDS.get(str(src.get("source")), "as configured")
    if counted_by == "server_usage":
        text = f"server usage (all {ok} ok requests); client tokenizer {name} ({kind}) is the cross-check"
    elif counted_by == "mixed":
        text = (
            f"server usage on {ok - missing} of {ok} ok requests, client tokenizer {name} ({kind}) "
            f"on the {missing} without usage"
        )
    elif counted_by == "client_tokenizer":
        text = f"client tokenizer {name} ({kind}): the server sent no usage"
    else:
        text = f"no ok request; client tokenizer {name} ({kind})"
    section = {
        "counted_by": counted_by,
        "description": text,
        "tokenizer": {**src, "name": name, "template": workload.tokenizer.template_file},
        "requests_without_usage": missing,
    }
    note = None
    if src.get("guessed") and missing > 0 and int(tok.get("counted_output_total") or 0) > 0:
        note = (
            f"tokens: {missing} of {ok} ok requests came without server usage, so their output tokens "
            f"(TPOT, tokens/s, goodput) are counted with {src.get('detail')}; "
            "give --tokenizer DIR (the model's tokenizer folder) for exact counts"
        )
    return section, note
