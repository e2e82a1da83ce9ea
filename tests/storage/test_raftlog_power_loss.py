"""The durability contract of the segment log under power loss (SimDisk): with durable=True, a
power cut at any instant leaves the log as of its last completed sync, or as of the sync it was
in (never acknowledged, but it may have reached the disk): never damaged, never anything else,
and the log it loads keeps working."""

from __future__ import annotations

import random
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from raftcron.chaos.sim.disk import PowerCut
from raftcron.cluster.storage.raftlog import RaftLog

from .logmodel import Image, LogModel, Place, command, fill

Step = Callable[[RaftLog], None]


def appends(first: int, last: int, term: int, size: int = 120) -> Step:
    def step(log: RaftLog) -> None:
        for index in range(first, last + 1):
            log.append(index, term, command(index, term, size))
        log.sync()
    return step


def truncation(index: int, then: Step) -> Step:
    def step(log: RaftLog) -> None:
        log.truncate_from(index)
        then(log)
    return step


def compaction(index: int) -> Step:
    def step(log: RaftLog) -> None:
        log.compact_to(index)
        log.sync()
    return step


def commit(index: int) -> Step:
    def step(log: RaftLog) -> None:
        log.set_commit(index)
        log.sync()
    return step


def reset_to(first: int, term: int) -> Step:
    """What installing a snapshot does: the log is exactly its two entries."""
    def step(log: RaftLog) -> None:
        log.reset()
        appends(first, first + 1, term)(log)
    return step


def clean_stop(log: RaftLog) -> None:
    log.close(clean=True)  # the mark: a file written, synced, renamed, its folder synced


# Each step ends in exactly one sync; rotation (450-byte segments), the deletion of dead
# segments, truncation, a reset, the hard state and the clean-stop mark are all in it.
SCENARIO: list[Step] = [
    appends(1, 3, 1),
    lambda log: log.set_hard_state(2, "n1"),
    appends(4, 7, 2),
    truncation(6, appends(6, 6, 3)),
    commit(5),
    compaction(5),
    appends(7, 10, 3),
    compaction(9),
    reset_to(30, 4),
    lambda log: log.set_hard_state(5, None),
    clean_stop,
]


def place_for_scenario() -> Place:
    return Place.in_memory(segment_bytes_max=450, cache_bytes_max=0)


def images_after_each_step() -> tuple[list[Image], int]:
    """The log's image before the first step and after each one; the disk calls they make."""
    place = place_for_scenario()
    before = place.sim.operations
    log = place.open()
    images = [Image.of(log)]
    for step in SCENARIO:
        image = Image.of(log)  # a closed log reads no commands: take its image before
        step(log)
        images.append(image if step is clean_stop else Image.of(log))
    return images, place.sim.operations - before


def test_a_power_cut_at_any_instant_leaves_the_last_synced_log_or_the_one_being_synced() -> None:
    images, operations = images_after_each_step()
    assert operations > 40
    for operation in range(operations):
        for variant in range(3):
            place = place_for_scenario()
            rng = random.Random(f"{operation}/{variant}")
            place.sim.cut_power_at(operation, rng, tear=variant > 0)
            completed = 0
            try:
                log = place.open()
                for step in SCENARIO:
                    step(log)
                    completed += 1
                raise AssertionError("the armed power cut never came")
            except PowerCut:
                pass
            after = place.open()  # never LogDamaged: a power cut is not damage
            candidates = images[completed:completed + 2]
            assert Image.of(after) in candidates, (operation, variant, completed)
            # The log it loaded keeps working: an append after the cut survives a reload.
            index = after.last_index + 1
            after.append(index, max(after.term, 9), b"after the cut")
            after.sync()
            again = place.crash(after)
            assert again.last_index == index and again.command_at(index) == b"after the cut"


def test_a_power_cut_leaves_exactly_what_was_synced() -> None:
    place = Place.in_memory(segment_bytes_max=500)
    log = place.open()
    fill(log, 1, 9, term=2, sync_each=True, size=60)
    log.set_hard_state(3, "n1")
    log.set_commit(9)
    log.sync()
    synced = Image.of(log)
    log.append(10, 3, b"never synced")
    log.set_commit(10)
    place.sim.power_cut(random.Random(1))
    again = place.open()
    assert Image.of(again) == synced


def test_without_fsync_a_power_cut_costs_the_last_writes_never_the_log() -> None:
    """durable=False ("os"): only the newest segment's tail is unsynced, so whatever a cut
    leaves loads (no LogDamaged), as a prefix of what was written, even after compactions
    that deleted segments."""
    for seed in range(20):
        place = Place.in_memory(segment_bytes_max=400, durable=False)
        log = place.open()
        written = []
        for index in range(1, 41):
            log.append(index, 1, command(index, 1, 60))
            log.sync()
            written.append((index, 1, command(index, 1, 60)))
            if index % 10 == 0:
                log.compact_to(index - 1)
                log.sync()
        place.sim.power_cut(random.Random(seed))
        after = Image.of(place.open())
        assert after.entries, seed
        assert list(after.entries) == written[after.entries[0][0] - 1:after.entries[-1][0]]
        assert after.entries[0][0] <= 39  # the last compaction may be lost, not the log


# -- random histories against a plain list ------------------------------------------------------

Operation = tuple[str, int]


operations = st.lists(st.tuples(
    st.sampled_from(["append", "append", "append", "append", "truncate", "compact", "compact",
                     "hard_state", "commit", "sync", "sync", "sync", "crash", "power_cut",
                     "cut_inside"]),
    st.integers(min_value=0, max_value=40)), min_size=1, max_size=60)


def apply(log: RaftLog, model: LogModel, name: str, number: int) -> None:
    """One operation on the log and the model alike."""
    if name == "append":
        term = max([model.term, *[entry[1] for entry in model.live[-1:]]]) + number % 2
        for _ in range(1 + number % 6):
            index = model.next_index(after_reset=log.first_index or 1)
            data = command(index, term, 20 + 7 * number)
            log.append(index, term, data)
            model.live.append((index, term, data))
    elif name == "truncate" and model.live:
        index = model.live[0][0] + number % (len(model.live) + 1)
        log.truncate_from(index)
        model.truncate_from(index)
    elif name == "compact" and len(model.live) > 1:
        index = model.live[0][0] + number % len(model.live)
        log.compact_to(index)
        model.compact_to(index)
    elif name == "hard_state":
        model.term, model.voted_for = model.term + 1, f"n{number % 3}" if number % 2 else None
        log.set_hard_state(model.term, model.voted_for)
        model.synced()
    elif name == "commit" and model.live:
        model.commit = model.live[0][0] + number % len(model.live)
        log.set_commit(model.commit)
    elif name == "sync":
        log.sync()
        model.synced()


@settings(max_examples=400)
@given(history=operations, seed=st.integers(0, 2**32 - 1))
def test_after_any_history_a_reload_holds_exactly_what_was_synced(
        history: list[Operation], seed: int) -> None:
    rng = random.Random(seed)
    place = Place.in_memory(segment_bytes_max=rng.choice([300, 800, 4000]),
                            cache_bytes_max=rng.choice([0, 100, 1 << 20]))
    log, model = place.open(), LogModel()
    for name, number in history:
        if name == "crash":  # the page cache survives: what was written stays, unsynced or not
            log = place.crash(log)
            model.live = list(model.durable.entries)
            model.term, model.voted_for = model.durable.term, model.durable.voted_for
            model.commit = model.durable.commit
        elif name in ("power_cut", "cut_inside"):
            before = model.durable
            maybe = before
            if name == "cut_inside":  # inside the next sync: it may or may not reach the disk
                place.sim.cut_power_at(number % 6, rng)
                try:
                    log.sync()
                    maybe = model.image()
                    place.sim.power_cut(rng)
                except PowerCut:
                    maybe = model.image()
            else:
                place.sim.power_cut(rng)
            log = place.open()
            assert Image.of(log) in (before, maybe)
            model.live = [*Image.of(log).entries]
            model.term, model.voted_for, model.commit = log.term, log.voted_for, log.commit_index
            model.synced()
        else:
            apply(log, model, name, number)
        assert Image.of(log) == model.image()
    log.sync()
    model.synced()
    assert Image.of(place.crash(log)) == model.durable
