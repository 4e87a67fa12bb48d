"""Bad input gets a 4xx with a reason; the server stays up and earlier data is unchanged."""

from __future__ import annotations

import gzip

import pytest

from tests.conftest import start_server
from tests.helpers import QUERIER, flamegraph, function_totals, ingest_pprof, make_pprof

T0 = 1_700_000_000
GOOD = make_pprof([(["kept_fn", "main"], 1234, {})], time_ns=T0 * 10**9)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):  # type: ignore[no-untyped-def]
    s = start_server(tmp_path_factory.mktemp("bad") / "data", ["--max-body-bytes", "300000"])
    with s.client() as c:
        assert ingest_pprof(c, "victim{}", GOOD, T0).status_code == 200
    yield s
    s.stop()


def _still_intact(srv) -> None:  # type: ignore[no-untyped-def]
    assert srv.process.poll() is None, "server died"
    with srv.client() as c:
        graph = flamegraph(c, '{service_name="victim"}', T0 - 10, T0 + 10)
        assert function_totals(graph) == {"main": 1234, "kept_fn": 1234}


valid_raw = gzip.decompress(GOOD)

INGEST_CASES = {
    "truncated pprof": ({"format": "pprof"}, valid_raw[: len(valid_raw) // 2], {}),
    "garbage pprof": ({"format": "pprof"}, b"\x08\x96\x01this is not a profile", {}),
    "empty pprof": ({"format": "pprof"}, b"", {}),
    "bad gzip": ({"format": "pprof"}, b"\x1f\x8b\x08\x00garbage", {}),
    "truncated gzip": ({"format": "pprof"}, GOOD[: len(GOOD) // 2], {}),
    "content-encoding gzip but plain": ({}, b"a;b 1\n", {"content-encoding": "gzip"}),
    "unknown content-encoding": ({}, b"a;b 1\n", {"content-encoding": "br"}),
    "unknown format": ({"format": "xml"}, b"<a/>", {}),
    "folded with bad value": ({"format": "folded"}, b"a;b;c lots\n", {}),
    "speedscope not json": ({"format": "speedscope"}, b"{not json", {}),
    "multipart without profile": (
        {"format": "pprof"},
        b'--XX\r\nContent-Disposition: form-data; name="other"\r\n\r\nx\r\n--XX--\r\n',
        {"content-type": "multipart/form-data; boundary=XX"},
    ),
    "bad sample_type_config": (
        {},
        b'--XX\r\nContent-Disposition: form-data; name="profile"; filename="p"\r\n\r\n'
        + valid_raw
        + b'\r\n--XX\r\nContent-Disposition: form-data; name="sample_type_config"; '
        b'filename="s.json"\r\n\r\n{oops\r\n--XX--\r\n',
        {"content-type": "multipart/form-data; boundary=XX"},
    ),
    "bad from": ({"from": "yesterday"}, b"a;b 1\n", {}),
    "bad tag name": ({"name": "app{bad-name=1}"}, b"a;b 1\n", {}),
    "no name": ({"name": None}, b"a;b 1\n", {}),
    "unsupported jfr": ({"format": "jfr"}, b"\x00", {}),
}


@pytest.mark.parametrize("case", sorted(INGEST_CASES))
def test_bad_ingest_is_refused_with_a_reason(srv, case: str) -> None:  # type: ignore[no-untyped-def]
    extra, body, headers = INGEST_CASES[case]
    params = {"name": "victim{}", "from": str(T0)}
    params.update(extra)
    params = {k: v for k, v in params.items() if v is not None}
    with srv.client() as c:
        r = c.post("/ingest", params=params, content=body, headers=headers)
    assert 400 <= r.status_code < 500, (case, r.status_code, r.text)
    assert len(r.text.strip()) > 5, "a reason is given"
    _still_intact(srv)


def test_body_over_the_limit(srv) -> None:  # type: ignore[no-untyped-def]
    with srv.client() as c:
        r = c.post(
            "/ingest", params={"name": "victim{}", "format": "folded"}, content=b"a;b 1\n" * 100_000
        )
        assert r.status_code == 413 and "limit" in r.text

        def chunks():  # type: ignore[no-untyped-def]
            for _ in range(100):
                yield b"a;b 1\n" * 1000  # no Content-Length: the limit holds while streaming

        r = c.post("/ingest", params={"name": "victim{}", "format": "folded"}, content=chunks())
        assert r.status_code == 413
        bomb = gzip.compress(b"\0" * 300_000_000)
        r = c.post("/ingest", params={"name": "victim{}", "format": "pprof"}, content=bomb)
        assert r.status_code == 400 and "limit" in r.text
    _still_intact(srv)


CONNECT_CASES = {
    "unknown content type": ("SelectMergeStacktraces", b"x", {"content-type": "text/xml"}, 415),
    "bad json": ("SelectMergeStacktraces", b"{bad", {"content-type": "application/json"}, 400),
    "bad proto": (
        "SelectMergeStacktraces",
        b"\xff\xff\xff",
        {"content-type": "application/proto"},
        400,
    ),
    "bad profile type": (
        "SelectMergeStacktraces",
        b'{"profileTypeID": "cpu", "labelSelector": "{}"}',
        {"content-type": "application/json"},
        400,
    ),
    "bad selector": (
        "SelectMergeStacktraces",
        b'{"profileTypeID": "a:b:c:d:e", "labelSelector": "{x=~\\"(\\"}"}',
        {"content-type": "application/json"},
        400,
    ),
    "reversed range": (
        "SelectMergeStacktraces",
        b'{"profileTypeID": "a:b:c:d:e", "labelSelector": "{}", "start": "200", "end": "100"}',
        {"content-type": "application/json"},
        400,
    ),
    "bad span id": (
        "SelectMergeSpanProfile",
        b'{"profileTypeID": "a:b:c:d:e", "labelSelector": "{}", "spanSelector": ["xyz"]}',
        {"content-type": "application/json"},
        400,
    ),
    "bad trace id": (
        "SelectMergeStacktraces",
        b'{"profileTypeID": "a:b:c:d:e", "labelSelector": "{}", "traceIdSelector": ["12"]}',
        {"content-type": "application/json"},
        400,
    ),
    "zero step": (
        "SelectSeries",
        b'{"profileTypeID": "a:b:c:d:e", "labelSelector": "{}", "step": 0}',
        {"content-type": "application/json"},
        400,
    ),
    "bad label matcher": (
        "LabelNames",
        b'{"matchers": ["{a=}"]}',
        {"content-type": "application/json"},
        400,
    ),
}


@pytest.mark.parametrize("case", sorted(CONNECT_CASES))
def test_bad_queries_get_connect_errors(srv, case: str) -> None:  # type: ignore[no-untyped-def]
    method, body, headers, status = CONNECT_CASES[case]
    with srv.client() as c:
        r = c.post(f"{QUERIER}/{method}", content=body, headers=headers)
    assert r.status_code == status, (case, r.text)
    err = r.json()
    assert err["code"] in ("invalid_argument", "unknown") and err["message"]
    _still_intact(srv)


def test_bad_push_requests(srv) -> None:  # type: ignore[no-untyped-def]
    with srv.client() as c:
        r = c.post(
            "/push.v1.PusherService/Push",
            json={
                "series": [
                    {"labels": [{"name": "a", "value": "b"}], "samples": [{"rawProfile": "AAAA"}]}
                ]
            },
        )
        assert r.status_code == 400 and "service_name" in r.json()["message"]
        r = c.post(
            "/push.v1.PusherService/Push",
            json={
                "series": [
                    {
                        "labels": [{"name": "service_name", "value": "victim"}],
                        "samples": [{"rawProfile": "AAAA"}],
                    }
                ]
            },
        )
        assert r.status_code == 400 and "pprof" in r.json()["message"]
        r = c.get(
            "/pyroscope/render",
            params={"query": "victim.cpu{", "from": str(T0 - 10), "until": str(T0 + 10)},
        )
        assert r.status_code == 400 and "error" in r.json()
        r = c.get(
            "/pyroscope/render",
            params={"query": "victim.cpu{}", "from": str(T0 + 10), "until": str(T0 - 10)},
        )
        assert r.status_code == 400
    _still_intact(srv)


def test_invalid_utf8_names_are_repaired(srv) -> None:  # type: ignore[no-untyped-def]
    from hotspan.formats.proto import profile_pb2

    p = profile_pb2.Profile.FromString(gzip.decompress(GOOD))
    idx = [s for s in p.string_table].index(b"kept_fn")
    p.string_table[idx] = b"bad\xff\xfename"
    with srv.client() as c:
        r = ingest_pprof(c, "utf8{}", p.SerializeToString(), T0)
        assert r.status_code == 200, r.text
        graph = flamegraph(c, '{service_name="utf8"}', T0 - 10, T0 + 10)
        assert "bad\ufffd\ufffdname" in graph["names"]
    _still_intact(srv)
