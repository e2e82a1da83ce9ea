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


def pieces_of(data: bytes, sizes: list[int]) -> list[bytes | memoryview]:
    view, out, start = memoryview(data), [], 0
    for size in sizes:
        out.append(view[start:start + size])
        start += size
    return [*out, data[start:]]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("size", [0, 10, 255, 256, 65_535, 65_536, 3 * compress.PART_BYTES + 5])
def test_a_body_with_its_state_in_pieces_is_the_zlib_of_packb_of_it(size: int,
                                                                     threads: int) -> None:
    state = state_bytes(size)
    body = {"prev": [b"", 9, 1], "last": [b"", 10, 1], "cluster": ["a:1", "b:2"],
            "state": state, "members": {"recorded": True}}
    expected = msgpack.packb(body, use_bin_type=True)
    streamed = {**body, "state": compress.Pieces(pieces_of(state, [3, 1000, 2 << 20]))}
    assert zlib.decompress(compress.compress_body(streamed, threads=threads)) == expected
    assert zlib.decompress(compress.compress_body(body, threads=threads)) == expected


def test_the_adler32_of_two_strings_joined_is_combined_from_each() -> None:
    rng = random.Random(3)
    for _ in range(50):
        a, b = rng.randbytes(rng.randrange(0, 300_000)), rng.randbytes(rng.randrange(0, 300_000))
        assert compress.adler32_combine(zlib.adler32(a), zlib.adler32(b), len(b)) == \
            zlib.adler32(a + b)


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
