"""`llm`: Claude proposes configs, the hypotheses they test, and new hypotheses, through the
`anthropic` SDK with structured output.

Each call sends the system prompt and one JSON document of data (`llm_prompt`) and asks, through
`output_config.format`, for a reply in the schema of `llm_schema` (no tools, so no tool choice).
The reply is untrusted: `llm_schema.read_reply` keeps only configs that parse in the space, meet
its constraints and are new, caps and flattens every text, and records the reason for each
thing it rejects. Nothing in a reply is executed.

A call asks for `per_call` configs at least; what is not handed out at once is kept for the
next rounds (still checked against the configs seen by then). The hypotheses a reply states go
to the driver (`drain_records`), whose lab tests them with paired experiments like its own;
the model's learnings are kept as text with the call's record and shown to it next time.

Every call becomes an `LlmCall` record (model, tokens, cost, stop reason, request id, error,
what was accepted and rejected), handed to the driver to store. Errors the SDK reports (an
overloaded or rejected request, a timeout, no connection), after the SDK's own retries, are
recorded and the round goes on without the model's configs; after `max_failures` calls in a
row that bring nothing, the proposer stops calling for this problem. The API key is read from
the environment (or the settings), given to the SDK client only, and scrubbed from every text
that leaves this module.

With `wait=False` (how the portfolio runs it) a call runs in a background thread: `propose`
hands out what earlier replies left and starts a call when they run low, so no round waits for
the model; `close` waits for a call in flight so that its cost is recorded.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from tilepilot.agents import llm_config
from tilepilot.agents.base import Proposer, ProposerContext, ProposerRecords, SearchState
from tilepilot.agents.llm_prompt import SYSTEM, Memory, constraint_text, user_message
from tilepilot.agents.llm_schema import MAX_REASON, Proposal, Reply, clean_text, read_reply, reply_schema
from tilepilot.experiments import Candidate, Config, InputError
from tilepilot.experiments.hypothesis import Hypothesis
from tilepilot.experiments.llm_call import LlmCall

log = logging.getLogger(__name__)

POOL_WORKERS = 4  # background calls at once, over all problems
MEMORY_REASONS = 10  # rejections of the last reply shown to the model in the next call
MEMORY_NOTES = 5  # the model's latest learnings shown to it in the next call
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


@dataclass(frozen=True)
class LlmSettings:
    model: str | None = None  # None: TILEPILOT_LLM_MODEL, else llm_config.DEFAULT_MODEL
    api_key: str | None = None  # None: ANTHROPIC_API_KEY
    per_call: int = 8  # configs asked for in one call, at least
    max_calls: int | None = None  # per problem; None: enough to fill the budget twice over, plus 2
    max_failures: int = 3  # calls in a row that bring no config before the proposer stops calling
    wait: bool = True  # False: call in the background, never hold up a round
    timeout_s: float = 90.0  # per HTTP request
    max_retries: int = 2  # the SDK's retries (overloaded, rate limited, 5xx, timeouts)
    max_tokens: int = 8192
    http_client: Any = None  # an httpx2.Client for the SDK (a proxy, or a test's MockTransport)


@dataclass(frozen=True)
class _Request:
    system: str
    user: str
    schema: dict[str, Any]
    want: int


@dataclass(frozen=True)
class _Answer:
    """What came back from one call, before the reply is read."""

    ts: float
    text: str
    stop_reason: str | None
    request_id: str | None
    usage: tuple[int, int, int, int] | None  # input, output, cache read, cache creation
    error: str
    duration_ms: float
    want: int


class LlmProposer(Proposer):
    name = "llm"

    def __init__(self, ctx: ProposerContext, settings: LlmSettings | None = None) -> None:
        super().__init__(ctx)
        self.settings = settings or LlmSettings()
        key = self.settings.api_key or llm_config.api_key()
        if key is None:
            raise InputError(llm_config.unavailable_reason() or f"proposer 'llm' needs {llm_config.KEY_ENV}")
        try:
            self.model = self.settings.model or llm_config.model_id()
        except ValueError as e:
            raise InputError(f"proposer 'llm': {e}") from None
        self._key = key
        self._client = _client(key, self.settings)
        self._buffer: list[Proposal] = []
        self._memory = Memory()
        self._constraints: list[str] | None = None
        self._future: Future[_Answer] | None = None
        self._calls = 0
        self._max_calls = self.settings.max_calls or 2 * math.ceil(ctx.budget / self.settings.per_call) + 2
        self._fruitless = 0  # calls in a row that brought no config
        self._records: list[LlmCall] = []
        self._hypotheses: list[Hypothesis] = []
        self._notes: list[str] = []

    @classmethod
    def unavailable(cls) -> str | None:
        return llm_config.unavailable_reason()

    # ---- the contract --------------------------------------------------------------------------
    def propose(self, state: SearchState, n: int) -> list[Candidate]:
        if n <= 0:
            return []
        self._collect(state, block=False)
        out = self._serve(state, n)
        attempts = 2 if self.settings.wait else 1  # waiting: one more call when a reply brings nothing
        while len(out) < n and attempts and self._may_call() and self._future is None:
            attempts -= 1
            served = SearchState(state.results, state.pending | {c.config for c in out})
            request = self._request(served, max(n - len(out), self.settings.per_call))
            self._calls += 1
            if not self.settings.wait:
                self._future = _background().submit(self._call, request)
                break
            self._fold(self._call(request), served.seen)
            got = self._serve(served, n - len(out))
            out += got
            if got:
                break
        return out

    def close(self) -> None:
        self._collect(SearchState(), block=True)
        if self.settings.http_client is None:  # a client given in the settings belongs to the caller
            self._client.close()

    def drain_records(self) -> ProposerRecords:
        records = ProposerRecords(tuple(self._records), tuple(self._hypotheses), tuple(self._notes))
        self._records, self._hypotheses, self._notes = [], [], []
        return records

    # ---- calls ---------------------------------------------------------------------------------
    def _may_call(self) -> bool:
        return self._calls < self._max_calls and self._fruitless < self.settings.max_failures

    def _request(self, state: SearchState, want: int) -> _Request:
        import anthropic

        if self._constraints is None:
            self._constraints = constraint_text(self.ctx.space, self.ctx)
        schema = anthropic.transform_schema(reply_schema(self.ctx.space, self.ctx.problem))
        return _Request(SYSTEM, user_message(self.ctx, state, want, self._memory, self._constraints), schema, want)

    def _call(self, request: _Request) -> _Answer:
        """One request through the SDK (its retries included). Safe to run in a worker thread."""
        import anthropic

        ts, t0 = time.time(), time.monotonic()
        try:
            message = self._client.messages.create(
                model=self.model, max_tokens=self.settings.max_tokens, system=request.system,
                messages=[{"role": "user", "content": request.user}],
                output_config={"format": {"type": "json_schema", "schema": request.schema}})
        except anthropic.APIStatusError as e:
            return self._failed(ts, t0, request, _status_error(e), e.request_id)
        except (anthropic.APIConnectionError, anthropic.APIResponseValidationError) as e:  # timeouts included
            return self._failed(ts, t0, request, clean_text(f"{type(e).__name__}: {e.message}", MAX_REASON), None)
        u = message.usage
        usage = (u.input_tokens, u.output_tokens, u.cache_read_input_tokens or 0, u.cache_creation_input_tokens or 0)
        text = "".join(block.text for block in message.content if block.type == "text")
        error = "the model refused to answer (stop_reason refusal)" if message.stop_reason == "refusal" else ""
        # `_request_id` is how the SDK exposes the request-id header on a response object
        return _Answer(ts, text, message.stop_reason, message._request_id, usage, error,
                       (time.monotonic() - t0) * 1e3, request.want)

    def _failed(self, ts: float, t0: float, request: _Request, error: str, request_id: str | None) -> _Answer:
        return _Answer(ts, "", None, request_id, None, error, (time.monotonic() - t0) * 1e3, request.want)

    def _collect(self, state: SearchState, *, block: bool) -> None:
        """Fold in the answer of a background call, if it is there (or, `block`: once it is)."""
        if self._future is None or not (block or self._future.done()):
            return
        future, self._future = self._future, None
        self._fold(future.result(), state.seen)

    # ---- replies -------------------------------------------------------------------------------
    def _fold(self, answer: _Answer, seen: set[Config]) -> None:
        reply = Reply()
        if not answer.error:
            reply = read_reply(answer.text, space=self.ctx.space, problem=self.ctx.problem,
                               seen=seen | {p.config for p in self._buffer}, want=answer.want,
                               kernel=self.ctx.kernel, device=self.ctx.device)
        self._buffer.extend(replace(p, rationale=self._scrub(p.rationale), tests=self._scrub(p.tests))
                            for p in reply.proposals)
        self._hypotheses.extend(replace(h, rationale=self._scrub(h.rationale)) for h in reply.hypotheses)
        if answer.stop_reason == "max_tokens":
            reply.rejected.insert(0, f"the reply was cut off at max_tokens ({self.settings.max_tokens})")
        reasons = tuple(self._scrub(r) for r in reply.rejected)
        learnings = tuple(self._scrub(t) for t in reply.learnings)
        self._memory = Memory(rejected=reasons[:MEMORY_REASONS], notes=(self._memory.notes + learnings)[-MEMORY_NOTES:])
        self._fruitless = 0 if reply.proposals else self._fruitless + 1
        record = self._record(answer, reply, reasons, learnings)
        self._records.append(record)
        log.info("llm %s for %s: %s", self.model, self.ctx.problem.label(), record.summary())
        if self._fruitless == self.settings.max_failures:
            self._notes.append(f"llm stops calling {self.model} for {self.ctx.problem.label()}: "
                               f"{self._fruitless} calls in a row brought no usable config")

    def _record(self, answer: _Answer, reply: Reply, reasons: tuple[str, ...], learnings: tuple[str, ...]) -> LlmCall:
        usage = answer.usage
        cost = None
        if usage is not None:
            cost = llm_config.cost_usd(self.model, input_tokens=usage[0], output_tokens=usage[1],
                                       cache_read_tokens=usage[2], cache_creation_tokens=usage[3])
        return LlmCall(
            ts=answer.ts, problem_key=self.ctx.problem.key(), model=self.model,
            input_tokens=usage[0] if usage else None, output_tokens=usage[1] if usage else None,
            cache_read_tokens=usage[2] if usage else None, cache_creation_tokens=usage[3] if usage else None,
            cost_usd=cost, stop_reason=answer.stop_reason, request_id=answer.request_id,
            error=self._scrub(answer.error), duration_ms=answer.duration_ms,
            proposals_accepted=len(reply.proposals), proposals_rejected=reply.proposals_rejected,
            hypotheses_stated=len(reply.hypotheses), rejected_reasons=reasons, learnings=learnings)

    def _serve(self, state: SearchState, n: int) -> list[Candidate]:
        seen = state.seen
        self._buffer = [p for p in self._buffer if p.config not in seen]
        taken, self._buffer = self._buffer[:n], self._buffer[n:]
        return [Candidate(self.ctx.problem, p.config, self.name, self._rationale(p), predicted_ms=p.predicted_ms)
                for p in taken]

    def _rationale(self, p: Proposal) -> str:
        why = f"{self.model}: {p.rationale}"
        if p.tests:
            why += f"; tests: {p.tests}"
        if p.predicted_ms is not None:
            why += f"; predicts {p.predicted_ms:.3g} ms"
        return why

    def _scrub(self, text: str) -> str:
        return text.replace(self._key, "[api key]") if self._key and self._key in text else text


def _client(key: str, settings: LlmSettings) -> Any:
    import anthropic

    return anthropic.Anthropic(api_key=key, max_retries=settings.max_retries, timeout=settings.timeout_s,
                               http_client=settings.http_client)


def _status_error(e: Any) -> str:
    detail = e.api_message or e.message
    return clean_text(f"HTTP {e.status_code} {type(e).__name__}: {detail}", MAX_REASON)


def _background() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=POOL_WORKERS, thread_name_prefix="tilepilot-llm")
        return _pool
