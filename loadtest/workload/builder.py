"""Turns a profile into concrete, deterministic work: unit i (one request, or a session) is the same for any worker layout."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from contextlib import contextmanager
from hashlib import blake2b
from pathlib import Path
from typing import Any

from loadtest.client.openai import PreparedRequest
from loadtest.client.record import RequestRecord
from loadtest.contracts.record_line import AgenticTurn
from loadtest.profile.dists import Fixed, Length
from loadtest.profile.schema import Profile, Scenario
from loadtest.schedule.arrivals import arrival_offsets, stage_offsets, trace_offsets
from loadtest.tokens.tokenizer import Tokenizer, get_tokenizer
from loadtest.traces import BLOCK_TOKENS, TraceRecord, read_trace, rescale, trace_block_tokens, window
from loadtest.traces.agent_graph import AgentCall
from loadtest.workload.agent_replay import (
    AgentTrace,
    AgentTraceUnit,
    bank_key,
    trajectory_units,
    with_replay_options,
)
from loadtest.workload.api_requests import ApiBuilder, builder_for
from loadtest.workload.dataset import (
    Dataset,
    DatasetRequest,
    DatasetSession,
    conversation_index,
    load_dataset,
    pass_units,
)
from loadtest.workload.images import image_part, user_content
from loadtest.workload.lengths import sample_length, sample_seconds
from loadtest.workload.prefix import PrefixBank
from loadtest.workload.salt import FINGERPRINT_NONCE, SALT_TOKENS, resolve_nonce, salt_text
from loadtest.workload.sessions import AgentSession, ChatSession, SessionCall
from loadtest.workload.text import chat_adds_pool_words, keyed_text, pool_words_are_tokens, synth_text
from loadtest.workload.units import Step, Unit

# The fingerprint stops building requests past this many prompt tokens: 64 requests of 250k tokens, a few
# seconds; huge prompts (up to the profile ceiling of 10M tokens each) would otherwise take minutes.
FINGERPRINT_TOKENS = 16_000_000
_SYSTEM_LEAD = "You are a helpful assistant. Answer the user's question clearly."
REASONING_EFFORT = "medium"


class SingleUnit(Unit):
    """A single request."""

    def __init__(self, request: PreparedRequest) -> None:
        self.scenario = request.scenario
        self._request: PreparedRequest | None = request

    def next(self, last: RequestRecord | None) -> Step | None:
        req, self._request = self._request, None
        return None if req is None else Step(req)


class SessionUnit(Unit):
    """A multi-turn chat or an agent: each call carries the server's actual previous answers."""

    def __init__(
        self,
        session: ChatSession | AgentSession | DatasetSession,
        scenario: Scenario,
        profile: Profile,
        index: int,
        model_seed: int | None = None,
    ) -> None:
        self.session = session
        self._model_seed = model_seed
        self.scenario = scenario.name
        self._profile = profile
        self._scenario = scenario
        self._index = index
        self._calls = 0

    def next(self, last: RequestRecord | None) -> Step | None:
        if last is not None:
            # A failed call ends the session; a tool call's streamed text stands in for its answer.
            answer = (last.answer_text or last.tool_calls_text) if last.outcome == "ok" else None
            self.session.record_answer(answer)
        call = self.session.next_request()
        if call is None:
            return None
        self._calls += 1
        suffix = f"{self._index}.{self._calls}"
        req = _session_request(call, self._scenario, self._profile, suffix, self._model_seed)
        return Step(req, call.think_before_s)


def _session_request(
    call: SessionCall, sc: Scenario, profile: Profile, suffix: str, model_seed: int | None
) -> PreparedRequest:
    body: dict[str, Any] = {"messages": call.messages, "max_tokens": call.max_tokens}
    if call.tools:
        body["tools"] = call.tools
        if call.answer_in_text:  # a turn ends with the agent's answer to the user, not another call
            body["tool_choice"] = "none"
    _length_controls(body, call.max_tokens, sc, model_seed)
    return PreparedRequest(
        request_id=f"{sc.name}-{suffix}",
        api="chat",
        body=body,
        prompt_tokens=call.prompt_tokens,
        requested_output_tokens=call.max_tokens,
        scenario=sc.name,
        stream=profile.stream,
        session=f"{sc.name}-{suffix.split('.', 1)[0]}",
        session_last=call.last,
        reference=call.reference,
    )


def _unit_interval(key: str) -> float:
    """A number in [0, 1) that follows from ``key`` alone (BLAKE2b, 53 bits)."""
    return (int.from_bytes(blake2b(key.encode(), digest_size=8).digest(), "little") >> 11) / 2**53


def _fixed(length: Length | None) -> bool:
    """Whether a length takes no draw (fixed, or not given)."""
    return length is None or length.dist == "fixed"


def _length_controls(body: dict[str, Any], n_out: int, sc: Scenario | Plan, model_seed: int | None) -> None:
    """What every generated body carries besides its messages: the length controls, the reasoning effort
    and a seed set's model seed (the OpenAI ``seed``; the Responses and Messages bodies drop it)."""
    if model_seed is not None:
        body["seed"] = model_seed
    if sc.ignore_eos:
        body["ignore_eos"] = True
        body["min_tokens"] = n_out
    if sc.reasoning:
        body["reasoning_effort"] = REASONING_EFFORT


class Plan:
    """What a scenario's every request reads of it, read once: a profile's models are pydantic's, and each
    attribute read through their ``__getattr__`` hook costs about 20 ns, a short request's build twenty
    of them."""

    def __init__(self, sc: Scenario, profile: Profile) -> None:
        self.scenario = sc
        self.name = sc.name
        self.kind = sc.kind
        self.api: str = sc.api or profile.api
        # the API's own request builder (workload/api_requests.py); None for chat and completions
        self.api_builder: ApiBuilder | None = builder_for(self.api)
        self.stream = profile.stream
        self.dataset = sc.dataset is not None
        self.salt = sc.salt
        self.ignore_eos = sc.ignore_eos
        self.reasoning = sc.reasoning
        self.prefix = sc.prefix
        self.images = sc.images
        self.input_tokens = sc.input_tokens
        self.output_tokens = sc.output_tokens
        # whether a request's build draws from the seeded generator (its lengths, its prefix group)
        self.draws = sc.prefix is not None or (
            sc.kind != "trace" and not (_fixed(sc.input_tokens) and _fixed(sc.output_tokens))
        )
        # the lengths when fixed (no draw), else -1
        self.fixed_input = _fixed_value(sc.input_tokens)
        self.fixed_output = _fixed_value(sc.output_tokens)


def _fixed_value(length: Length | None) -> int:
    """A fixed length's value; -1 for a drawn one or none."""
    return length.value if isinstance(length, Fixed) else -1


class Workload:
    """Builds unit ``i`` of a run from the profile, the seed and the run nonce alone.

    ``run_nonce`` is the run's random nonce (``RunSettings.run_nonce``, the same in every worker); the
    profile's ``run_salt`` decides whether prompts carry it (``per_run``), a nonce derived from the
    seed (``per_seed``) or none (``off``). Without one, a ``per_run`` workload draws its own.
    """

    def __init__(
        self,
        profile: Profile,
        seed: int | None = None,
        tokenizer: str | None = None,
        run_nonce: int | None = None,
        schedule_seed: int | None = None,
        model_seed: int | None = None,
    ) -> None:
        self.profile = profile
        self.seed = profile.seed if seed is None else seed
        self._id_lead = f"{self.seed:x}-"  # request ids: this and the index (the hex made once)
        # the arrival schedule's seed: a seed set's scheduler_rng_seed, else the one seed
        self.schedule_seed = self.seed if schedule_seed is None else schedule_seed
        # a seed set's model_seed: sent as the OpenAI `seed` of every generated chat and completions request
        self.model_seed = model_seed
        self.tokenizer: Tokenizer = get_tokenizer(tokenizer or profile.tokenizer)
        self._pool_tokens = pool_words_are_tokens(self.tokenizer)  # n pool words are n tokens
        # and a chat prompt of pool words counts its template and system prompt plus its words
        self._chat_adds = self._pool_tokens and chat_adds_pool_words(self.tokenizer)
        self.nonce: int | None = resolve_nonce(profile.run_salt, run_nonce, self.seed)
        self.scenarios = list(profile.scenarios)
        total = sum(s.weight for s in self.scenarios)
        acc = 0.0
        self._cumulative: list[float] = []
        for s in self.scenarios:
            acc += s.weight / total
            self._cumulative.append(acc)
        self.trace: list[TraceRecord] | None = self._load_trace()
        self.block_tokens = self._trace_block_tokens()
        self.prefixes = self._prefix_bank(self.nonce)
        self._system: dict[str, str] = {s.name: self._system_prompt(s) for s in self.scenarios}
        self._overhead: dict[str, int] = {}
        self._rng = random.Random()  # _single's generator, seeded per request
        self._plans = [Plan(s, profile) for s in self.scenarios]
        # Each dataset scenario's conversations, read now (errors name the scenario's dataset field).
        self.datasets: dict[str, Dataset] = {
            s.name: load_dataset(s, i, self.tokenizer, s.api or profile.api, self.seed)
            for i, s in enumerate(self.scenarios)
            if s.dataset is not None
        }
        # Each agent_trace scenario's recorded sessions, read now (a malformed line names file and field).
        self.agent_traces: dict[str, AgentTrace] = {
            s.name: with_replay_options(
                AgentTrace.load(s.agent_trace, f"scenarios[{i}].agent_trace.path", self.tokenizer),
                s.agent_trace,
            )
            for i, s in enumerate(self.scenarios)
            if s.agent_trace is not None
        }
        # dataset.passes or agent_trace.trajectories: units in all
        self.pass_units: int | None = pass_units(self.scenarios, self.datasets) or trajectory_units(
            self.scenarios
        )

    # ---- what to send ----
    def scenario_for(self, index: int) -> Scenario:
        return self._plan_for(index).scenario

    def _plan_for(self, index: int) -> Plan:
        plans = self._plans
        if len(plans) == 1:
            return plans[0]
        key = f"{self.seed}:mix:{index}"
        # with a nonce a hash of the key (as the request's words); without one the generator earlier
        # versions drew from, so run_salt: off keeps its scenario sequence
        u = random.Random(key).random() if self.nonce is None else _unit_interval(key)
        for plan, edge in zip(plans, self._cumulative, strict=True):
            if u < edge:
                return plan
        return plans[-1]

    def unit(self, index: int) -> Unit:
        plan = self._plan_for(index)
        kind, sc = plan.kind, plan.scenario
        if plan.dataset:
            return self._dataset_unit(sc, index)
        if kind == "multi_turn":
            return SessionUnit(self._chat_session(sc, index), sc, self.profile, index, self.model_seed)
        if kind == "agent":
            return SessionUnit(self._agent_session(sc, index), sc, self.profile, index, self.model_seed)
        if kind == "agent_trace":
            return self._agent_trace_unit(sc, index)
        return SingleUnit(self._single_of(plan, index))

    def request(self, index: int) -> PreparedRequest:
        """The first request of unit ``index``."""
        step = self.unit(index).next(None)
        assert step is not None
        return step.request

    # ---- when to send it (open loop) ----
    def arrival_offsets(self) -> Iterator[float]:
        """Seconds after the start at which units 0, 1, 2, … arrive, for the open-loop load modes."""
        load = self.profile.load
        if self.trace is not None:
            return trace_offsets([r.timestamp_s for r in self.trace])
        if load.stages:
            stages = [(st.duration_s, float(st.rate or 0.0), st.ramp) for st in load.stages]
            return stage_offsets(stages, self.schedule_seed, load.arrival, load.cv or 1.0)
        if load.rate is None:
            raise ValueError("closed-loop profile: no arrival schedule")
        return arrival_offsets(load.rate, self.schedule_seed, load.arrival, load.cv or 1.0)

    @property
    def schedule_span_s(self) -> float | None:
        """How long the open-loop schedule lasts, when it ends by itself (a trace, stages)."""
        if self.trace is not None:
            return self.trace[-1].timestamp_s if self.trace else 0.0
        if self.profile.load.stages:
            return sum(st.duration_s for st in self.profile.load.stages)
        return None

    # ---- building blocks ----
    def _load_trace(self) -> list[TraceRecord] | None:
        spec = self.profile.load.trace
        if spec is None:
            return None
        records = read_trace(Path(spec.path), spec.format)
        if spec.window_s is not None:
            records = window(records, spec.window_s[0], spec.window_s[1])
        if spec.speedup is not None or spec.target_rate is not None:
            records = rescale(records, speedup=spec.speedup, target_rate=spec.target_rate)
        if spec.max_requests is not None:
            records = records[: spec.max_requests]
        return records

    def _trace_block_tokens(self) -> int:
        """Tokens per hash-id block: the trace format's own (Bailian 16, Mooncake 512)."""
        spec = self.profile.load.trace
        return BLOCK_TOKENS if spec is None else trace_block_tokens(Path(spec.path), spec.format)

    def _prefix_bank(self, nonce: int | None) -> PrefixBank:
        return PrefixBank(self.seed, self.tokenizer, block_tokens=self.block_tokens, nonce=nonce)

    def salt_lead(self, sc: Scenario | Plan, key: int | str) -> str:
        """The salt that follows a request's shared prefix: the per-query salt (``salt: true``) or the
        run salt, both mixed with the run nonce; "" with neither (``run_salt: off``, no ``salt``)."""
        if not sc.salt and self.nonce is None:
            return ""
        return salt_text(self.seed, key, self.nonce)

    def _system_prompt(self, sc: Scenario) -> str:
        if not sc.system_prompt_tokens:
            return ""
        rng = random.Random(f"{self.seed}:system:{sc.name}")
        lead_tokens = self.tokenizer.count(_SYSTEM_LEAD)
        return _SYSTEM_LEAD + synth_text(max(0, sc.system_prompt_tokens - lead_tokens), rng, self.tokenizer)

    def _lengths(self, plan: Plan, index: int, rng: random.Random) -> tuple[int, int, tuple[int, ...]]:
        if plan.kind == "trace" and self.trace is not None:
            r = self.trace[index % len(self.trace)]
            return r.input_tokens, max(1, r.output_tokens), r.hash_ids
        n_in, n_out = plan.fixed_input, plan.fixed_output
        if n_in < 0:
            assert plan.input_tokens is not None
            n_in = sample_length(plan.input_tokens, rng)
        if n_out < 0:
            assert plan.output_tokens is not None
            n_out = sample_length(plan.output_tokens, rng)
        return n_in, max(1, n_out), ()

    def _single(self, sc: Scenario, index: int) -> PreparedRequest:
        """Request ``index`` of a single-request scenario (``sc`` one of the profile's, or a copy of one)."""
        plan = next((p for p in self._plans if p.scenario is sc), None)
        return self._single_of(plan or Plan(sc, self.profile), index)

    def _single_of(self, plan: Plan, index: int) -> PreparedRequest:
        if plan.api_builder is not None:  # responses, embeddings, raw replay, …
            return plan.api_builder(self, plan.scenario, index)
        rng = self._rng  # reseeded, not made anew: the same draws without a new generator per request
        key = f"{self.seed}:{index}"
        # With a nonce the request's own words are keyed by the seed and index (keyed_text); the
        # generator is seeded only when the scenario draws from it (lengths, prefix groups). Without
        # one (run_salt: off) every body is the one earlier versions sent.
        if self.nonce is None or plan.draws:
            rng.seed(key)
        n_in, n_out, hash_ids = self._lengths(plan, index, rng)
        api = plan.api
        body: dict[str, Any] = {"max_tokens": n_out}
        _length_controls(body, n_out, plan, self.model_seed)
        system = self._system[plan.name] if api == "chat" else ""
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        overhead = self._chat_overhead(plan.name, messages) if api == "chat" else 0
        budget = max(1, n_in - overhead)
        # Shared prefix (at most the request's own length: a shorter text of a group is a prefix of
        # the longer one, so short requests still share), then the salt, then the request's own text.
        # Hash-id blocks carry the run nonce in their text instead (their reuse is the trace's own).
        lead = ""
        prefix = plan.prefix
        if prefix is not None:
            group = rng.randrange(prefix.groups)
            lead += self.prefixes.group_text(group, min(prefix.tokens, budget - 1))
        if plan.salt or not hash_ids:
            lead += self.salt_lead(plan, index)
        text_tokens = -1  # the text's count where it is known without counting: pool words alone
        if prefix is None and self._pool_tokens:  # the salt alone (SALT_TOKENS pool words) or no lead
            lead_tokens = SALT_TOKENS if lead else 0
            rest = max(1, budget - lead_tokens)
            if not hash_ids:  # the request's own words are exactly ``rest`` pool words
                text_tokens = lead_tokens + rest
        else:
            rest = max(1, budget - self.tokenizer.count(lead))
        if hash_ids:
            text = lead + self.prefixes.blocks_text(hash_ids, rest)
        elif self.nonce is None:
            text = lead + synth_text(rest, rng, self.tokenizer)
        else:
            text = lead + keyed_text(rest, key.encode(), self.tokenizer)
        if api == "chat":
            content: Any = text
            if plan.images is not None:
                im = plan.images
                image_seed = self.seed if self.nonce is None else self.seed ^ self.nonce
                parts = [
                    image_part(image_seed, index * 16 + k, im.width, im.height, im.detail)
                    for k in range(im.count)
                ]
                content = user_content(text, parts)
            messages.append({"role": "user", "content": content})
            body["messages"] = messages
            if text_tokens >= 0 and plan.images is None and self._chat_adds:
                prompt_tokens = overhead + text_tokens
            else:
                prompt_tokens = self.tokenizer.count_chat(messages)
        else:
            body["prompt"] = text
            prompt_tokens = text_tokens if text_tokens >= 0 else self.tokenizer.count(text)
        return PreparedRequest(
            request_id=self._id_lead + str(index),
            api=api,
            body=body,
            prompt_tokens=prompt_tokens,
            requested_output_tokens=n_out,
            scenario=plan.name,
            stream=plan.stream,
        )

    def _dataset_unit(self, sc: Scenario, index: int) -> Unit:
        """Conversation ``index`` (cycling) of the scenario's dataset: one request, or a session."""
        assert sc.dataset is not None
        convs = self.datasets[sc.name].conversations
        conv = convs[conversation_index(sc.dataset, self.seed, sc.name, index, len(convs))]
        if len(conv) > 1:
            session = DatasetSession(conv, sc.dataset, self.seed, f"{sc.name}:{index}", sc.reasoning)
            return SessionUnit(session, sc, self.profile, index, self.model_seed)
        return SingleUnit(self._dataset_request(sc, conv[0], index))

    def _dataset_request(self, sc: Scenario, r: DatasetRequest, index: int) -> PreparedRequest:
        """A dataset's prompt as it is (no salt: it would change the text; docs/datasets.md)."""
        api = sc.api or self.profile.api
        body: dict[str, Any] = {"max_tokens": r.output_tokens}
        _length_controls(body, r.output_tokens, sc, self.model_seed)
        if api == "chat":
            body["messages"] = [dict(m) for m in r.messages]
        else:
            body["prompt"] = r.prompt
        return PreparedRequest(
            request_id=self._id_lead + str(index),
            api=api,
            body=body,
            prompt_tokens=r.prompt_tokens,
            requested_output_tokens=r.output_tokens,
            scenario=sc.name,
            stream=self.profile.stream,
            reference=r.reference,
        )

    def _chat_overhead(self, scenario: str, system_messages: list[dict[str, Any]]) -> int:
        """Template and system-prompt tokens around the user's text (the same for every request)."""
        n = self._overhead.get(scenario)
        if n is None:
            n = self._overhead[scenario] = self.tokenizer.count_chat(
                [*system_messages, {"role": "user", "content": ""}]
            )
        return n

    def _agent_trace_unit(self, sc: Scenario, index: int) -> AgentTraceUnit:
        """Conversation ``index`` (cycling) of the scenario's recording, its block texts keyed by the run
        nonce and ``bank_key`` (the unit's own by default: no two units, nor runs, share a cached prefix)."""
        trace = self.agent_traces[sc.name]
        conv = trace.conversations[index % len(trace.conversations)]
        key = hashlib.sha256(f"{self.nonce}:{bank_key(trace, sc.name, index)}".encode()).hexdigest()
        bank = PrefixBank(self.seed, self.tokenizer, block_tokens=conv.block_tokens, nonce=int(key[:15], 16))
        session = f"{sc.name}-{index}"

        def build(request_id: str, call: AgentCall, bank: PrefixBank) -> PreparedRequest:
            tools: list[dict[str, Any]] = []
            agentic = None
            if call.recorded is not None:  # the recorded conversation as it was sent
                messages, tools = list(call.recorded.messages), list(call.recorded.tools)
                if call.recorded.expected is not None:  # what the inline accuracy check compares
                    agentic = AgenticTurn.expecting(conv.id, call.recorded.turn, call.recorded.expected)
            else:
                text = bank.blocks_text(
                    call.hash_ids, max(1, call.input_tokens - self._chat_overhead(sc.name, []))
                )
                messages = [{"role": "user", "content": text}]
            n_out = max(1, call.output_tokens)
            body: dict[str, Any] = {"messages": messages, "max_tokens": n_out}
            if tools:
                body["tools"] = tools
            _length_controls(body, n_out, sc, self.model_seed)
            return PreparedRequest(
                request_id=request_id,
                api="chat",
                body=body,
                prompt_tokens=self.tokenizer.count_request(messages, tools or None),
                requested_output_tokens=n_out,
                scenario=sc.name,
                stream=self.profile.stream,
                session=session,
                agentic=agentic,
            )

        return AgentTraceUnit(trace, sc.name, index, bank, build)

    def _chat_session(self, sc: Scenario, index: int) -> ChatSession:
        assert sc.session is not None and sc.input_tokens is not None and sc.output_tokens is not None
        s, inp, out = sc.session, sc.input_tokens, sc.output_tokens
        return ChatSession(
            self.seed,
            index,
            self.tokenizer,
            turns=lambda r: sample_length(s.turns, r),
            input_tokens=lambda r: sample_length(inp, r),
            output_tokens=lambda r: max(1, sample_length(out, r)),
            think_time_s=lambda r: sample_seconds(s.think_time_s, r),
            system_prompt=self._system[sc.name],
            salt=sc.salt,
            expect_reasoning=sc.reasoning,
            nonce=self.nonce,
        )

    def _agent_session(self, sc: Scenario, index: int) -> AgentSession:
        assert sc.agent is not None and sc.input_tokens is not None and sc.output_tokens is not None
        a, inp, out = sc.agent, sc.input_tokens, sc.output_tokens
        return AgentSession(
            self.seed,
            index,
            self.tokenizer,
            prefix_tokens=a.prefix_tokens,
            tools=a.tools,
            turns=lambda r: sample_length(a.turns, r),
            input_tokens=lambda r: sample_length(inp, r),
            calls_per_turn=lambda r: max(1, sample_length(a.calls_per_turn, r)),
            output_tokens=lambda r: max(1, sample_length(out, r)),
            tool_result_tokens=lambda r: sample_length(a.tool_result_tokens, r),
            max_context_tokens=a.max_context_tokens,
            think_time_s=lambda r: sample_seconds(a.think_time_s, r),
            expect_reasoning=sc.reasoning,
            nonce=self.nonce,
        )

    def dataset_summary(self) -> dict[str, dict[str, Any]]:
        """run.json ``workload.datasets``: per dataset scenario its file's name and sha256, rows read,
        conversations and requests used."""
        out = {}
        for sc in self.scenarios:
            ds = self.datasets.get(sc.name)
            if ds is not None and sc.dataset is not None:
                out[sc.name] = {
                    "file": Path(sc.dataset.path).name,
                    "sha256": ds.sha256,
                    "rows": ds.rows,
                    "conversations": len(ds.conversations),
                    "requests": sum(len(c) for c in ds.conversations),
                }
        return out

    def fingerprint(self, n: int = 64) -> str:
        """A hash of the resolved profile and the first ``n`` units' first requests (fewer once their
        prompts total FINGERPRINT_TOKENS): equal means same traffic.

        The requests are built with a fixed nonce: runs of one profile and seed share a fingerprint
        whatever their run nonces (``run_salt`` itself is part of the profile, so it counts)."""
        h = hashlib.sha256(json.dumps(_without_locations(self.profile), sort_keys=True).encode())
        h.update(f"{self.seed}:{Path(self.tokenizer.name).name}".encode())
        if self.trace is not None:
            h.update(
                json.dumps([(r.timestamp_s, r.input_tokens, r.output_tokens) for r in self.trace]).encode()
            )
        for name, ds in sorted(self.datasets.items()):  # the content, not where the file lies
            h.update(f"{name}:{ds.sha256}".encode())
        built = 0
        with self._fixed_nonce():
            for i in range(n):
                r = self.request(i)
                h.update(json.dumps(r.body, sort_keys=True).encode())
                built += r.prompt_tokens
                if built >= FINGERPRINT_TOKENS:
                    break
        return h.hexdigest()

    @contextmanager
    def _fixed_nonce(self) -> Iterator[None]:
        """Build requests with ``FINGERPRINT_NONCE`` in place of the run's nonce (none stays none)."""
        if self.nonce is None:
            yield
            return
        saved = self.nonce, self.prefixes
        self.nonce = FINGERPRINT_NONCE
        self.prefixes = self._prefix_bank(FINGERPRINT_NONCE)
        try:
            yield
        finally:
            self.nonce, self.prefixes = saved


def _without_locations(profile: Profile) -> dict[str, Any]:
    """The profile as data, with the files it names reduced to their names (and no
    ``judging.generator_health``).

    Where a trace, a recorded-body file or a tokenizer lies on this machine is not part of the
    traffic (their content is hashed separately), so two checkouts of one profile match.
    """
    doc = profile.model_dump(mode="json")
    # How the verdict treats the generator's health is not traffic: warn and fail runs compare alike.
    (doc.get("judging") or {}).pop("generator_health", None)
    # Neither are what is captured nor how answers are checked (profile/quality.py).
    doc.pop("capture", None)
    doc.pop("quality", None)
    trace = (doc.get("load") or {}).get("trace")
    if trace and trace.get("path"):
        trace["path"] = Path(trace["path"]).name
    for sc in doc.get("scenarios") or []:
        if sc.get("raw") and sc["raw"].get("file"):
            sc["raw"]["file"] = Path(sc["raw"]["file"]).name
        if sc.get("dataset"):
            sc["dataset"].pop("path", None)  # hashed by content: a renamed copy is the same traffic
    if doc.get("tokenizer") and ("/" in doc["tokenizer"] or doc["tokenizer"].endswith(".json")):
        doc["tokenizer"] = Path(doc["tokenizer"]).name
    return doc
