"""Request traces: read public LLM traces into `TraceRecord`s, cut and re-time them, summarise them.

Supported formats (`TRACE_FORMATS`; `read_trace(path)` sniffs the first line when `format="auto"`):

- ``azure``: Azure LLM inference CSV, ``TIMESTAMP,ContextTokens,GeneratedTokens``; TIMESTAMP like
  ``2023-11-16 18:15:46.6805900`` (all fractional digits kept).
- ``mooncake``: Mooncake JSONL, ``timestamp`` (ms), ``input_length``, ``output_length``,
  ``hash_ids`` (512-token prefix-chained blocks; equal ids mean a shared prefix).
- ``burstgpt``: BurstGPT CSV, ``Timestamp`` (s), ``Model``, ``Request tokens``, ``Response tokens``,
  ``Total tokens``, ``Log Type``; rows with 0 response tokens are failed requests and are kept.
- ``bailian``: Qwen-Bailian JSONL, ``chat_id, parent_chat_id, timestamp (s), input_length,
  output_length, type, turn, hash_ids``; session = root chat_id of the conversation; ``hash_ids``
  are 16-token blocks (``trace_block_tokens`` gives each format's block size).
- ``loadtest``: this project's own JSONL, one object per line::

      {"t": 0.25, "input_tokens": 812, "output_tokens": 96,
       "hash_ids": [0, 1], "session": "s17", "turn": 2, "scenario": "chat"}

  ``t`` is seconds (any origin; rebased so the first request is at 0), ``input_tokens`` and
  ``output_tokens`` are non-negative integers; ``hash_ids`` (list of ints, 512-token
  prefix-chained blocks), ``session`` (string), ``turn`` (int) and ``scenario`` (string, stored
  as ``kind``) are optional. Blank lines are skipped; unknown keys are ignored.

- ``cc-traces``: WEKA / SemiAnalysis recorded agent sessions, one JSON object a line (``id``,
  ``block_size``, ``requests`` of calls and subagents); each call one record (``read_cc_traces``),
  or the whole session graph with ``traces.cctraces.read_cc_conversations``.

Every reader returns records sorted by arrival with timestamps rebased to start at 0 and raises
`TraceFormatError` naming the file, the line and the field for malformed input. See docs/traces.md.
"""

from loadtest.traces.azure import read_azure
from loadtest.traces.bailian import read_bailian
from loadtest.traces.burstgpt import read_burstgpt
from loadtest.traces.empirical import QUANTILE_GRID, empirical_points, empirical_spec
from loadtest.traces.errors import TraceFormatError
from loadtest.traces.formats import TRACE_FORMATS, read_trace, sniff_format, trace_block_tokens
from loadtest.traces.mooncake import read_mooncake
from loadtest.traces.native import read_loadtest
from loadtest.traces.record import BLOCK_TOKENS, TraceRecord
from loadtest.traces.stats import trace_stats
from loadtest.traces.transform import mean_rate, rescale, window

__all__ = [
    "BLOCK_TOKENS",
    "QUANTILE_GRID",
    "TRACE_FORMATS",
    "TraceFormatError",
    "TraceRecord",
    "empirical_points",
    "empirical_spec",
    "mean_rate",
    "read_azure",
    "read_bailian",
    "read_burstgpt",
    "read_loadtest",
    "read_mooncake",
    "read_trace",
    "rescale",
    "sniff_format",
    "trace_block_tokens",
    "trace_stats",
    "window",
]
