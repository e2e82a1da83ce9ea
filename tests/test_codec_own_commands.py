"""A node applies a command it proposed as it built it (cluster/consensus/replica.py `expect`), the
other replicas as they decode it: the two must be the same command, whatever JSON the API parsed it
from (payloads of every JSON type, every job field). Model-made commands are held to the same in
tests/test_core_model.py."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from raftcron.scheduler import codec
from raftcron.scheduler.commands import SubmitJobs, wire_fingerprint
from raftcron.scheduler.errors import Invalid
from raftcron.scheduler.snapshot import snapshot
from raftcron.scheduler.state import SchedulerState

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12,
)
names = st.from_regex(r"[a-z0-9][a-z0-9_.:-]{0,12}", fullmatch=True)
jobs = st.fixed_dictionaries(
    {"task": names},
    optional={
        "payload": json_values,
        "queue": names,
        "priority": st.integers(-100, 100),
        "key": names,
        "delay_ms": st.integers(0, 10_000),
        "max_attempts": st.integers(1, 10),
        "backoff": st.fixed_dictionaries({"initial_ms": st.integers(1, 1000),
                                          "factor": st.floats(1, 4), "max_ms": st.just(60_000)}),
        "timeout_ms": st.integers(1, 100_000),
        "concurrency": st.fixed_dictionaries({"key": names, "max": st.integers(1, 5)}),
    },
)


@settings(max_examples=300, deadline=None)
@given(st.lists(jobs, min_size=1, max_size=5), st.booleans())
def test_a_submit_parsed_from_json_decodes_as_itself(raw: list[dict[str, Any]],
                                                     with_id: bool) -> None:
    wire: dict[str, Any] = {"jobs": raw}
    if with_id:
        wire["request_id"] = "r-1"
    try:
        command = SubmitJobs.from_wire(wire)
    except Invalid:
        return  # refused before it is proposed: nothing to apply
    frame, fingerprint = codec.encode_request(command)
    decoded, decoded_fingerprint = codec.decode_request(frame)
    assert decoded == command
    assert decoded_fingerprint == fingerprint
    if with_id:
        assert fingerprint == wire_fingerprint(SubmitJobs.TAG, command.to_wire())
    own, other = SchedulerState(), SchedulerState()
    assert own.apply(command, fingerprint) == other.apply(decoded, decoded_fingerprint)
    assert snapshot(own) == snapshot(other)


def test_a_node_applies_its_own_proposal_without_decoding_it(monkeypatch: Any) -> None:
    from raftcron.cluster.consensus.replica import StateMachine, encode_batch
    from raftcron.scheduler.commands import Tick

    machine = StateMachine()
    machine.apply(encode_batch([codec.encode(Tick(1_000))]), _doApply=True)
    command = SubmitJobs.from_wire({"request_id": "r-1", "jobs": [{"task": "t"}] * 3})
    frame, fingerprint = codec.encode_request(command)
    machine.expect(frame, command, fingerprint)

    decoded: list[bytes] = []
    original = codec.decode_request

    def decode_request(data: bytes) -> Any:
        decoded.append(data)
        return original(data)

    monkeypatch.setattr(codec, "decode_request", decode_request)
    [result] = machine.apply(encode_batch([frame]), _doApply=True)
    assert result.value["jobs"] == [[1, True], [2, True], [3, True]], result
    assert decoded == [] and not machine._proposed  # taken as it was, once
    [repeat] = machine.apply(encode_batch([frame]), _doApply=True)
    assert decoded == [frame] and repeat == result  # a repeat of the entry decodes: the same


def test_a_proposal_given_up_is_forgotten() -> None:
    from raftcron.cluster.consensus.replica import StateMachine

    machine = StateMachine()
    command = SubmitJobs.from_wire({"jobs": [{"task": "t"}]})
    frame, fingerprint = codec.encode_request(command)
    machine.expect(frame, command, fingerprint)
    machine.forget([frame])
    assert not machine._proposed
