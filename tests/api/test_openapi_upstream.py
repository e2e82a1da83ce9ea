"""The claim answer's `upstream` (scheduler/upstream.py) is what the OpenAPI document says:
delivered results, and parents past the cap marked for reading, in a `ClaimResponse`."""

from __future__ import annotations

from raftcron.scheduler import upstream, views
from raftcron.scheduler.commands import SubmitWorkflow
from raftcron.scheduler.driver import Driver
from raftcron.scheduler.specs import WorkflowSpec

from .apidoc import component, schema_errors


def test_a_claim_answer_with_upstream_results_matches_the_document():
    d = Driver()
    parents = [f"p{i}" for i in range(5)]
    spec = WorkflowSpec.parse({"jobs": [*({"name": name, "task": "t"} for name in parents),
                                        {"name": "c", "task": "t", "after": parents}]})
    d.ok(SubmitWorkflow(d.request_id(), spec))
    for job_id, token in d.claim(max=5):
        d.complete(job_id, token, {"blob": "x" * 60_000})
    claimed = [[job_id, token] for job_id, token in d.claim()]
    jobs = upstream.attach(d.state, views.claimed_jobs(d.state, claimed))
    delivered = [part["delivered"] for part in jobs[0]["upstream"].values()]
    assert delivered == [True] * 4 + [False]
    answer = {"jobs": jobs, "acks": []}
    assert schema_errors(component("ClaimResponse"), answer) == []
    jobs[0]["upstream"]["p4"]["delivered"] = "no"
    assert schema_errors(component("ClaimResponse"), answer) != []
