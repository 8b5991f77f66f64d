"""``loadtest accuracy BENCH:FILE``: every dataset sample sent once, the answers scored against the targets."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import time
from pathlib import Path

from loadtest.cli.common_options import add_out_option, engine_parent
from loadtest.cli.run_options import engine_overrides
from loadtest.errors import (
    EXIT_ACCURACY_FAILED,
    EXIT_INTERRUPTED,
    EXIT_WRITE_FAILED,
    LoadtestError,
    UsageError,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "accuracy",
        help="an accuracy run: every sample of a local dataset once, scored (ROUGE, exact match, length)",
        description="Sends every sample of the dataset once (no salt, the benchmark's sampling, whole answers) to "
        "--host or the embedded engine, scores the answers against the benchmark's published targets, "
        f"writes accuracy.json and exits {EXIT_ACCURACY_FAILED} when a target is missed (docs/accuracy.md).",
        parents=[engine_parent("; --engine-reference answers from the dataset")],
    )
    p.add_argument(
        "spec",
        metavar="BENCH:FILE",
        help="benchmark (llama3.1-8b, gpt-oss-120b, deepseek-r1) and its local dataset file",
    )
    p.add_argument("-H", "--host", metavar="URL", help="the endpoint (default: start the embedded engine)")
    p.add_argument(
        "-m", "--model", metavar="NAME", help="the model to ask for (default: the first one served)"
    )
    keys = p.add_mutually_exclusive_group()
    keys.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the API key")
    keys.add_argument("--api-key-file", metavar="PATH", help="file holding the API key")
    p.add_argument(
        "--concurrency", type=int, default=8, metavar="N", help="requests in flight (default: %(default)s)"
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        metavar="N",
        help="the answer's token limit (default: the benchmark's: llama3.1-8b 128, gpt-oss-120b 32768, deepseek-r1 20000)",
    )
    p.add_argument(
        "--engine-reference",
        action="store_true",
        help="the embedded engine answers each prompt with the dataset's reference (tests the accuracy path)",
    )
    add_out_option(p, "the run folder (default: runs/accuracy-BENCH-<time>)")


def _spec(text: str) -> tuple[str, Path]:
    bench, sep, file = text.partition(":")
    if not sep or not bench or not file:
        raise UsageError(f"accuracy: {text!r}: give BENCH:FILE, e.g. llama3.1-8b:cnn_eval.json")
    return bench, Path(file)


def _progress(done: int, total: int) -> None:
    print(f"  {done}/{total} samples answered", flush=True)


def accuracy_command(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except LoadtestError as e:
        print(f"loadtest: error: {e}", file=sys.stderr)
        return e.exit_code


def _run(args: argparse.Namespace) -> int:
    from loadtest.accuracy.benchmarks import benchmark
    from loadtest.accuracy.datasets import load_dataset
    from loadtest.accuracy.results import summary_line, write_result
    from loadtest.accuracy.run import AccuracyTarget, collect_answers, reference_answers, score_run
    from loadtest.client.preflight import EndpointError, ModelNotServed, require_served, served_models
    from loadtest.client.secrets import KeySourceError, install_redaction, load_api_key
    from loadtest.profile.loader import load_profile
    from loadtest.sim.start import EngineStartError, start_engine
    from loadtest.tokens.tokenizer import DEFAULT_TOKENIZER, bundled_family, get_tokenizer

    name, path = _spec(args.spec)
    bench = benchmark(name)
    dataset = load_dataset(bench.dataset_kind, path)
    if args.concurrency < 1:
        raise UsageError("--concurrency must be ≥ 1")
    if args.max_tokens is not None:
        if args.max_tokens < 1:
            raise UsageError("--max-tokens must be ≥ 1")
        bench = dataclasses.replace(bench, max_tokens=args.max_tokens)
    if args.engine_reference and args.host:
        raise UsageError("--engine-reference is for the embedded engine; leave out --host")
    run_dir = Path(args.out or f"runs/accuracy-{bench.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"-o/--out {run_dir}: cannot make the run folder ({e.strerror or e})") from e
    try:
        api_key = load_api_key(args.api_key_env, args.api_key_file)
    except KeySourceError as e:
        raise UsageError(str(e)) from e
    install_redaction(api_key)
    with contextlib.ExitStack() as stack:
        base_url = args.host
        if base_url is None:
            opts = engine_overrides(args)
            if args.engine_reference:
                refs = reference_answers(dataset, run_dir / "reference_answers.jsonl")
                opts = dataclasses.replace(opts, reference_answers=str(refs))
            profile, _ = load_profile(f"mlperf-{bench.name}-server")
            try:
                base_url = start_engine(stack, opts, profile, 0, run_dir / "engine.log")["url"]
            except EngineStartError as e:
                raise (UsageError(str(e)) if e.usage else LoadtestError(str(e))) from e
        try:
            served = served_models(base_url, api_key)
            require_served(args.model, served, base_url, "--model")
        except ModelNotServed as e:
            ids = ", ".join(m.id for m in served)
            raise UsageError(
                f"--model {args.model!r} is not served by {base_url}; give one it lists: {ids}"
            ) from e
        except EndpointError as e:
            raise LoadtestError(str(e)) from e
        model = args.model or (served[0].id if served else None)
        tokenizer = get_tokenizer(bundled_family(model) or DEFAULT_TOKENIZER)
        target = AccuracyTarget(base_url, model, tokenizer, api_key, args.concurrency)
        print(f"accuracy {bench.name}: {len(dataset.samples)} samples of {path} to {base_url}", flush=True)
        try:
            records = collect_answers(bench, dataset, target, _progress)
        except KeyboardInterrupt:
            print(
                "loadtest: accuracy run interrupted (Ctrl-C) before every sample was answered; "
                "no accuracy.json written (a score needs the whole dataset)",
                file=sys.stderr,
            )
            return EXIT_INTERRUPTED["SIGINT"]
    result = score_run(bench, dataset, records)
    try:
        written = write_result(run_dir, result)
    except OSError as e:
        print(
            f"loadtest: error: {run_dir}/accuracy.json could not be written ({e.strerror or e})",
            file=sys.stderr,
        )
        print(summary_line(result))
        return EXIT_WRITE_FAILED
    for note in result.notes:
        print(f"note: {note}")
    print(summary_line(result))
    print(f"accuracy.json: {written}")
    return 0 if result.passed else EXIT_ACCURACY_FAILED
