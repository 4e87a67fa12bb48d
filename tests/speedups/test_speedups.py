"""The C fast path and the pure-Python path give identical results, and malformed input
makes the C decoder raise, never crash."""

from __future__ import annotations

import gzip
import random
import zlib
from dataclasses import fields

import numpy as np
import pytest

from hotspan import _speedups
from hotspan.formats import compression, pprof_decode
from hotspan.formats.errors import FormatError
from hotspan.formats.proto import profile_pb2
from hotspan.model import hashing
from tests.conftest import FIXTURES
from tests.helpers import make_pprof

fast = _speedups.load()
pytestmark = pytest.mark.skipif(
    fast is None,
    reason="C speedups not loaded (not built at install time, or HOTSPAN_NO_SPEEDUPS is set)",
)


def _equal(a: pprof_decode.DecodedProfile, b: pprof_decode.DecodedProfile) -> None:
    for f in fields(pprof_decode.DecodedProfile):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.shape == y.shape and np.array_equal(x, y), f.name
        else:
            assert list(x) == list(y) if f.name == "strings" else x == y, f.name


def _samples():  # type: ignore[no-untyped-def]
    rng = random.Random(7)
    out = [
        make_pprof(
            [
                (
                    [f"m{rng.randrange(30)}.f" for _ in range(rng.randint(1, 12))],
                    rng.randint(1, 9),
                    {"span_id": f"{rng.getrandbits(64):016x}"} if i % 2 else {"thread": "main"},
                )
                for i in range(50)
            ],
            compress=False,
        )
    ]
    # Sparse ids take the binary-search path of the C lookup; duplicates keep the first.
    sparse = profile_pb2.Profile.FromString(out[0])
    for fn in sparse.function:
        fn.id *= 1_000_003
    for loc in sparse.location:
        loc.id *= 7_000_001
        for line in loc.line:
            line.function_id *= 1_000_003
    for sample in sparse.sample:
        sample.location_id[:] = [i * 7_000_001 for i in sample.location_id]
    dup = sparse.function.add()
    dup.CopyFrom(sparse.function[0])
    dup.name = 0
    out.append(sparse.SerializeToString())
    pprofs = FIXTURES / "og" / "convert" / "pprof" / "testdata"
    if pprofs.exists():
        for path in sorted(pprofs.iterdir()):
            if path.suffix in (".gz", ".pprof", ".pb"):
                data = path.read_bytes()
                out.append(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    return out


def test_hashes_match_python() -> None:
    rng = random.Random(1)
    for _ in range(200):
        name = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
        line = rng.randrange(-(2**63), 2**63)
        assert fast.hash_frame(name, b"file.py", line) == hashing.hash_frame(name, b"file.py", line)
        ids = [rng.randrange(-(2**63), 2**63) for _ in range(rng.randrange(50))]
        packed = np.array(ids, dtype=np.int64).tobytes()
        offsets = np.array([0, len(ids)], dtype=np.int64).tobytes()
        got = np.frombuffer(fast.hash_stacks(packed, offsets), dtype=np.int64)
        assert got.tolist() == [hashing.hash_stack(ids)]


def test_decoders_agree_on_real_profiles() -> None:
    for raw in _samples():
        _equal(pprof_decode.decode(raw), pprof_decode.decode_python(raw))


def test_mutated_input_raises_cleanly_in_both() -> None:
    rng = random.Random(3)
    seeds = _samples()[:4]
    outcomes = {"ok": 0, "error": 0}
    for _ in range(3000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 6)):
            op = rng.random()
            pos = rng.randrange(len(data))
            if op < 0.5:
                data[pos] = rng.randrange(256)
            elif op < 0.8:
                del data[pos : pos + rng.randint(1, 20)]
            else:
                data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        raw = bytes(data)
        try:
            fast_result = pprof_decode.decode(raw)
        except FormatError:
            fast_result = None
        try:
            py_result = pprof_decode.decode_python(raw)
        except FormatError:
            py_result = None
        if fast_result is None or py_result is None:
            outcomes["error"] += 1
            continue
        # Where both accept the bytes they must agree (upb may still reject more, e.g.
        # invalid wire types the C decoder skips, so only compare successes).
        _equal(fast_result, py_result)
        outcomes["ok"] += 1
    assert outcomes["error"] > 100 and outcomes["ok"] > 100


def test_unknown_and_mistyped_fields_are_skipped_like_upb() -> None:
    raw = _samples()[0]
    extras = {
        "time_nanos as bytes": b"\x4a\x02ab",  # field 9, wire type 2 instead of varint
        "group": b"\xa3\x06\x08\x01\xa4\x06",  # field 100: start group, varint, end group
        "fixed32": b"\xa5\x06abcd",
        "fixed64": b"\xa1\x06abcdefgh",
    }
    for extra in extras.values():
        _equal(pprof_decode.decode(raw + extra), pprof_decode.decode_python(raw + extra))
    # Field numbers past 2^29 - 1 are invalid in both.
    for bad in (b"\x80\x80\x80\x80\x10\x00", b"\x80\x80\x80\x80\x80\x80\x80\x01\x00"):
        with pytest.raises(FormatError):
            pprof_decode.decode(raw + bad)
        with pytest.raises(FormatError):
            pprof_decode.decode_python(raw + bad)


def test_depth_and_frame_limits_agree() -> None:
    deep = make_pprof([([f"f{i}" for i in range(50)], 1, {})], compress=False)
    fast_result = pprof_decode.decode(deep, max_depth=10)
    _equal(fast_result, pprof_decode.decode_python(deep, max_depth=10))
    assert fast_result.frame_off.tolist() == [0, 10]
    # A limit far past any stack asks for no memory of its own.
    _equal(pprof_decode.decode(deep, max_depth=1 << 40), pprof_decode.decode_python(deep))
    with pytest.raises(FormatError, match="too many frames"):
        pprof_decode.decode(deep, max_frames=20)
    with pytest.raises(FormatError, match="too many frames"):
        pprof_decode.decode_python(deep, max_frames=20)


def test_truncated_everywhere() -> None:
    raw = _samples()[0]
    rejected = 0
    for cut in range(0, len(raw), max(1, len(raw) // 400)):
        try:
            got = pprof_decode.decode(raw[:cut])
        except FormatError:
            rejected += 1
            continue
        # A cut on a field boundary is a valid, smaller profile: both paths must agree on it.
        _equal(got, pprof_decode.decode_python(raw[:cut]))
    assert rejected > 300


def _upload_outcome(decode, data: bytes, max_size: int):  # type: ignore[no-untyped-def]
    try:
        return decode(data, max_size)
    except FormatError as exc:
        return str(exc)


def _python_upload(data: bytes, max_size: int) -> pprof_decode.DecodedProfile:
    """The path without the C decoder, inflating with zlib as the C decoder does."""
    raw = compression.maybe_gunzip(data, max_size, zlib.decompressobj)
    if not raw:
        raise FormatError("empty pprof profile")
    return pprof_decode.decode_python(raw)


def test_the_c_decoder_inflates_uploads_as_the_python_path_does() -> None:
    raw = _samples()[0]
    one = gzip.compress(raw, mtime=0)
    half = len(raw) // 2
    cases = {
        "plain": raw,
        "gzipped": one,
        "two members": gzip.compress(raw[:half], mtime=0) + gzip.compress(raw[half:], mtime=0),
        "a trailer that lies about the size": one[:-4] + b"\x01\x00\x00\x00",
        "truncated": one[: len(one) // 2],
        "cut before the trailer": one[:-3],
        "garbage after a member": one + b"garbage!",
        "corrupt deflate data": one[:12] + bytes(b ^ 0x5A for b in one[12:40]) + one[40:],
        "empty gzip": gzip.compress(b"", mtime=0),
        "empty": b"",
    }
    for name, data in cases.items():
        for max_size in (len(raw) - 1, len(raw), len(raw) + 1, 1 << 20):
            mine = _upload_outcome(pprof_decode.decode_inflating, data, max_size)
            theirs = _upload_outcome(_python_upload, data, max_size)
            if isinstance(theirs, str):
                # Same refusal; zlib's own words after "bad gzip data:" may vary.
                assert isinstance(mine, str), (name, max_size, theirs)
                assert mine.split(":")[0] == theirs.split(":")[0], (name, max_size)
            else:
                assert not isinstance(mine, str), (name, max_size, mine)
                _equal(mine, theirs)
    with pytest.raises(FormatError, match="larger than the limit of 1000 bytes"):
        pprof_decode.decode_inflating(gzip.compress(b"\x00" * 10**7), 1000)


def _frames_profile(frames: list) -> bytes:  # type: ignore[type-arg]
    """One sample per frame of ``frames`` ((name, file, line)), as pprof."""
    p = profile_pb2.Profile()
    table = [""]
    p.sample_type.add(type=1, unit=2)
    table += ["cpu", "nanoseconds"]
    for i, (name, file, line) in enumerate(frames, start=1):
        table += [name, file]
        p.function.add(id=i, name=len(table) - 2, filename=len(table) - 1)
        p.location.add(id=i).line.add(function_id=i, line=line)
        p.sample.add(location_id=[i], value=[1])
    p.string_table.extend(t.encode() for t in table)
    return p.SerializeToString()


def test_frame_ids_remembered_across_decodes_stay_exact() -> None:
    # Frames that differ only where name ends and file begins, by line, by a byte past the
    # eighth, by length; one too long to be remembered; and enough of them to evict.
    frames = [
        ("ab", "c.py", 1),
        ("a", "bc.py", 1),
        ("ab", "c.py", 2),
        ("", "", 0),
        ("n" * 5000, "long.py", 3),
    ]
    frames += [("f" * n, "m.py", 7) for n in range(20)]
    frames += [
        (f"pkg.mod.Class.method_{i}", f"/srv/app/pkg/mod{i % 97}.py", i) for i in range(40000)
    ]
    raw = _frames_profile(frames)
    expected = [hashing.hash_frame(n.encode(), f.encode(), line) for n, f, line in frames]
    for _ in range(3):  # the second and third decodes find most frames remembered
        got = pprof_decode.decode(raw)
        assert got.frame_id.tolist() == expected
    mixed = _frames_profile(frames[:5] + frames[-3000:] + frames[5:30])
    _equal(pprof_decode.decode(mixed), pprof_decode.decode_python(mixed))
