"""How clients' and workers' requests reach the log: batches, answers, retries.

Owns ``Request`` (one logical request: its encoded bytes, every answer it got and when) and
``Outbox``, which sends the due requests in batches (one log entry per node per step, like the
product's Proposer), reads the answers, and retries with the SAME bytes (same request id)
through whichever node it picks next: an attempt that failed or was not answered within
COMMIT_TIMEOUT_S, and an answer ``not_ready`` (HTTP 503 with Retry-After: the cluster's clock
has not started), as cluster/clients/asyncclient.py does. A request not answered by its deadline is
given up (its outcome stays unknown: it may still commit). It never decides what to send.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from raftcron.chaos.sim.cluster import Proposal
from raftcron.chaos.tier1.world import SimWorld
from raftcron.cluster.consensus.replica import encode_batch
from raftcron.scheduler import codec
from raftcron.scheduler.commands import Command
from raftcron.scheduler.errors import Rejected, Result


class OutboxRun(SimWorld, Protocol):
    """What the outbox needs of the run beyond the `SimWorld` (the `SeedRun` of chaos.tier1.run
    implements both; this module does not import it)."""

    def pick_node(self) -> str | None: ...

    def propose(self, node_id: str, key: str, payload: bytes) -> Proposal: ...


COMMIT_TIMEOUT_S = 2.0  # an unanswered attempt is indeterminate after this: retry elsewhere
REQUEST_DEADLINE_S = 8.0  # a client gives up (the outcome stays unknown) after this
RETRY_CODES = frozenset({"not_ready"})  # answers with HTTP 503: the client tries again


def retry_later(result: Result) -> bool:
    return isinstance(result, Rejected) and result.code in RETRY_CODES


@dataclass(eq=False)
class Request:
    command: Command
    origin: str
    sent_s: float  # when it was first proposed
    deadline_s: float
    frame: bytes = b""
    answers: list[tuple[float, Result]] = field(default_factory=list)  # every one, 503s too
    next_try_s: float = 0.0
    attempts: int = 0  # proposals carrying it (retries go through another node)
    in_flight: Proposal | None = None
    done: bool = False  # answered, or given up
    on_answer: Callable[[Result], None] | None = None
    on_give_up: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        self.frame = codec.encode(self.command)

    @property
    def request_id(self) -> str:
        return str(getattr(self.command, "request_id", "") or "")

    def acknowledged(self) -> Result | None:
        """The answer the caller acted on: the first one that is not a 'retry later'."""
        final = self.final_answer()
        return None if final is None else final[1]

    def final_answer(self) -> tuple[float, Result] | None:
        return next(((at_s, r) for at_s, r in self.answers if not retry_later(r)), None)

    @property
    def not_ready(self) -> int:
        return sum(retry_later(result) for _at_s, result in self.answers)


class Outbox:
    """Sends requests in batches (one log entry per node per step), retries the unanswered."""

    def __init__(self, run: OutboxRun) -> None:
        self.run = run
        self.requests: list[Request] = []
        self.batches: list[tuple[Proposal, list[Request]]] = []
        self.sent = 0

    def send(self, request: Request) -> Request:
        request.next_try_s = self.run.now_s
        self.requests.append(request)
        return request

    def step(self) -> None:
        now_s = self.run.now_s
        still: list[tuple[Proposal, list[Request]]] = []
        for proposal, batch in self.batches:
            if proposal.outcome is None:
                still.append((proposal, batch))
                if now_s - proposal.proposed_at_s > COMMIT_TIMEOUT_S:
                    self._retry_later(batch, proposal)
                continue
            results = proposal.result
            if not proposal.acknowledged:
                self._retry_later(batch, proposal)
            elif isinstance(results, list) and len(results) == len(batch):
                for request, result in zip(batch, results, strict=True):
                    self._answered(request, result, proposal)
            else:  # the product's Proposer would answer every caller with a rejection
                self.run.problems.append(f"a batch of {len(batch)} was answered {results!r}")
        self.batches = still
        self._flush()

    def _answered(self, request: Request, result: Result, proposal: Proposal) -> None:
        request.answers.append((self.run.now_s, result))
        if retry_later(result):
            self._retry_later([request], proposal)
            return
        request.in_flight = None
        if not request.done:
            request.done = True
            if request.on_answer is not None:
                request.on_answer(result)

    def _retry_later(self, batch: list[Request], proposal: Proposal) -> None:
        for request in batch:
            if request.in_flight is proposal and not request.done:
                request.in_flight = None
                request.next_try_s = self.run.now_s + self.run.rng.uniform(0.05, 0.5)

    def _flush(self) -> None:
        now_s = self.run.now_s
        by_node: dict[str, list[Request]] = {}
        for request in self.requests:
            if request.done or request.in_flight is not None or request.next_try_s > now_s:
                continue
            if now_s > request.deadline_s:
                request.done = True  # indeterminate: it may still commit later
                if request.on_give_up is not None:
                    request.on_give_up()
                continue
            target = self.run.pick_node()
            if target is not None:
                by_node.setdefault(target, []).append(request)
        self.requests = [request for request in self.requests if not request.done]
        for node_id, batch in by_node.items():
            self.sent += 1
            payload = encode_batch([request.frame for request in batch])
            proposal = self.run.propose(node_id, f"batch-{self.sent}", payload)
            for request in batch:
                request.in_flight = proposal
                request.attempts += 1
            self.batches.append((proposal, batch))
