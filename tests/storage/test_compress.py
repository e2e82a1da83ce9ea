"""cluster/storage/compress.py: a snapshot's body packed in pieces is the same msgpack, and
compressed in parts at once is one standard zlib stream of it."""

from __future__ import annotations

import random
import zlib

import msgpack
import pytest

from raftcron.cluster.storage import compress
from raftcron.cluster.storage.snapshots import decode, encode


def state_bytes(size: int, seed: int = 7) -> bytes:
    rng = random.Random(seed)  # compressible like a state: repeated rows with some noise
    row = msgpack.packb([1, "succeeded", 1_764_000_000_000, "queue-a", None, b"x" * 40])
    out = bytearray()
    while len(out) < size:
        out += row + rng.randbytes(rng.randrange(0, 8))
    return bytes(out[:size])


@pytest.mark.parametrize("size", [0, 10, compress._INLINE_BYTES - 1, compress._INLINE_BYTES,
                                  3 * compress.PART_BYTES + 5])
def test_the_pieces_are_packb_of_the_body(size: int) -> None:
    body = {"prev": [b"", 9, 1], "last": [b"", 10, 1], "cluster": ["a:1", "b:2"],
            "state": state_bytes(size), "members": {"recorded": True}}
    assert b"".join(compress.body_pieces(body)) == msgpack.packb(body, use_bin_type=True)


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("size", [0, 1, compress.PART_BYTES, 5 * compress.PART_BYTES + 123])
def test_parts_compressed_at_once_are_one_zlib_stream(size: int, threads: int) -> None:
    data = state_bytes(size)
    pieces = [b"head", data, b"tail"]
    stream = compress.compress(pieces, threads=threads)
    assert zlib.decompress(stream) == b"head" + data + b"tail"  # what every release reads
    assert stream[:2] == zlib.compress(b"", compress.LEVEL)[:2]
    if size >= compress.PART_BYTES:  # within 0.1% of compressing the whole in one go
        assert len(stream) < 1.001 * len(zlib.compress(b"head" + data + b"tail", 1)) + 64


def test_a_damaged_part_is_found_by_the_decoder() -> None:
    stream = bytearray(compress.compress([state_bytes(2 * compress.PART_BYTES)], threads=2))
    stream[len(stream) // 2] ^= 0x40
    with pytest.raises(zlib.error):
        zlib.decompress(bytes(stream))


def test_a_snapshot_file_of_a_large_state_reads_back() -> None:
    state = state_bytes(3 * compress.PART_BYTES)
    body = {"prev": [b"", 41, 2], "last": [b"", 42, 2], "cluster": ["a:1"], "state": state}
    snapshot = decode(b"".join(encode(42, 2, body)), "snapshot")
    assert (snapshot.index, snapshot.term, snapshot.state) == (42, 2, state)
