"""Results along the DAG on a real 3-node cluster with a real worker process: a workflow
child reads its parents' results as `ctx.upstream[name]`, those the claim delivered and those
past its cap, which the worker reads on demand from a node."""

from __future__ import annotations

from raftcron.cluster.clients.client import Client

from .conftest import StartWorker


def test_a_workflow_child_reads_its_parents_results(
    client: Client, queue: str, start_worker: StartWorker
) -> None:
    worker = start_worker(queue, "w-upstream")
    flow = client.submit_workflow([
        {"name": "extract", "task": "echo", "queue": queue, "payload": {"rows": 3}},
        {"name": "load", "task": "upstream", "queue": queue, "after": ["extract"]},
        {"name": "report", "task": "upstream-async", "queue": queue, "after": ["load"]},
    ])
    ids = {job["name"]: job["id"] for job in flow["jobs"]}
    extract = client.wait(ids["extract"], timeout_s=30)
    load = client.wait(ids["load"], timeout_s=30)
    report = client.wait(ids["report"], timeout_s=30)
    assert extract["status"] == load["status"] == report["status"] == "succeeded", load
    assert load["result"] == {"extract": extract["result"]}
    assert extract["result"]["echo"] == {"rows": 3}
    assert report["result"] == {"load": load["result"]}
    assert worker.process.poll() is None


def test_results_past_the_claims_cap_are_read_from_a_node(
    client: Client, queue: str, start_worker: StartWorker
) -> None:
    start_worker(queue, "w-upstream-big")
    parents = [f"part{i}" for i in range(6)]  # 6 x 60,000: past the 256 KiB a claim carries
    flow = client.submit_workflow([
        *({"name": name, "task": "sized", "queue": queue, "payload": {"bytes": 60_000}}
          for name in parents),
        *({"name": name, "task": f"upstream{suffix}", "queue": queue, "after": parents,
           "payload": {"lengths": True}} for name, suffix in (("sync", ""), ("async", "-async"))),
    ])
    ids = {job["name"]: job["id"] for job in flow["jobs"]}
    for name in ("sync", "async"):
        done = client.wait(ids[name], timeout_s=30)
        assert done["status"] == "succeeded", (done["error"], done["history"])
        assert done["result"] == dict.fromkeys(parents, 60_000)
