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
    "speedscope nested too deeply": ({"format": "speedscope"}, b"[" * 100_000, {}),
    "sample_type_config nested too deeply": (
        {},
        b'--XX\r\nContent-Disposition: form-data; name="profile"; filename="p"\r\n\r\n'
        + valid_raw
        + b'\r\n--XX\r\nContent-Disposition: form-data; name="sample_type_config"; '
        b'filename="s.json"\r\n\r\n' + b"[" * 100_000 + b"\r\n--XX--\r\n",
        {"content-type": "multipart/form-data; boundary=XX"},
    ),
    "sampleRate not a number": ({"sampleRate": "abc"}, b"a;b 1\n", {}),
    "sampleRate negative": ({"sampleRate": "-100"}, b"a;b 1\n", {}),
    "sampleRate past a nanosecond": ({"sampleRate": "99999999999999999999999"}, b"a;b 1\n", {}),
    "too many labels": (
        {"name": "victim{" + ",".join(f"k{i}=v" for i in range(100)) + "}"},
        b"a;b 1\n",
        {},
    ),
    "label value too long": ({"name": "victim{k=" + "v" * 3000 + "}"}, b"a;b 1\n", {}),
    "service name too long": ({"name": "v" * 3000 + "{}"}, b"a;b 1\n", {}),
    "pprof label value too long": (
        {"format": "pprof"},
        make_pprof([(["a", "b"], 1, {"k": "v" * 3000})], time_ns=T0 * 10**9),
        {},
    ),
    "NUL in a label value": ({"name": "victim{k=a\x00b}"}, b"a;b 1\n", {}),
    "bad from": ({"from": "yesterday"}, b"a;b 1\n", {}),
    "bad tag name": ({"name": "app{bad-name=1}"}, b"a;b 1\n", {}),
    "no name": ({"name": None}, b"a;b 1\n", {}),
    "garbage jfr": ({"format": "jfr"}, b"\x00", {}),
    "truncated jfr header": ({"format": "jfr"}, b"FLR\x00\x00\x02\x00\x00", {}),
    "pprof sent as lines": ({"format": "lines"}, valid_raw, {}),
    "trie cut short": (
        {"format": "trie"},
        b"\x00\x00\x02\x01a\x00\x02\x01b\x01\x00\x01c\x01\x00",
        {},
    ),
    "tree name past the end": (
        {},
        b"\x00\x00\x01\x7fab",
        {"content-type": "binary/octet-stream+tree"},
    ),
    "jfr sent as pprof": ({"format": "pprof"}, b"FLR\x00" + bytes(100), {}),
}

# What the reason must say, where it must say more than that the body is bad.
REASONS = {
    "truncated jfr header": "truncated",
    "pprof sent as lines": "not text",
    "jfr sent as pprof": "format=jfr",
    "trie cut short": "unread",
    "tree name past the end": "past the end",
    "unknown format": "trie or tree",  # the formats it could have meant
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
    assert REASONS.get(case, "") in r.text, r.text
    # The reason may echo what was sent: no browser may read it as a page.
    assert r.headers["x-content-type-options"] == "nosniff"
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
    "negative series limit": (
        "SelectSeries",
        b'{"profileTypeID": "a:b:c:d:e", "labelSelector": "{}", "step": 15, "limit": "-1"}',
        {"content-type": "application/json"},
        400,
    ),
    "unknown format": (
        "SelectMergeStacktraces",
        b'{"profileTypeID": "a:b:c:d:e", "labelSelector": "{}", "format": 99}',
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


def test_pathological_regex_does_not_stall_the_server(srv) -> None:  # type: ignore[no-untyped-def]
    # Backtracking engines take exponential time on this; RE2 (as Prometheus) is linear.
    evil = '{__profile_type__=~"(.*)*(.*)*(.*)*(.*)*z"}'
    with srv.client(timeout=10) as c:
        r = c.post(
            f"{QUERIER}/LabelNames",
            json={"matchers": [evil], "start": (T0 - 10) * 1000, "end": (T0 + 10) * 1000},
        )
        assert r.status_code == 200 and r.json() == {}
    _still_intact(srv)


def test_colon_in_a_sample_type_is_sanitised(server) -> None:  # type: ignore[no-untyped-def]
    colon_type = "process_cpu:cpu_evil:nanoseconds:cpu:nanoseconds"
    body = make_pprof(
        [(["colon_fn", "main"], 7, {})], sample_type=("cpu:evil", "nanoseconds"), time_ns=T0 * 10**9
    )
    with server.client() as c:
        assert ingest_pprof(c, "victim{}", GOOD, T0).status_code == 200
        assert ingest_pprof(c, "colon{}", body, T0).status_code == 200
        graph = flamegraph(c, '{service_name="colon"}', T0 - 10, T0 + 10, profile_type=colon_type)
        assert function_totals(graph)["colon_fn"] == 7
    # The store opens again and reads every series back.
    assert server.stop() == 0
    again = start_server(server.data_dir)
    try:
        _still_intact(again)
        with again.client() as c:
            graph = flamegraph(
                c, '{service_name="colon"}', T0 - 10, T0 + 10, profile_type=colon_type
            )
            assert function_totals(graph)["colon_fn"] == 7
    finally:
        again.stop()


def test_deep_stacks_are_cut_at_1000_frames(srv) -> None:  # type: ignore[no-untyped-def]
    deep = ";".join(f"f{i}" for i in range(5000))
    with srv.client() as c:
        r = c.post(
            "/ingest",
            params={"name": "deep.cpu", "from": str(T0), "format": "folded"},
            content=f"{deep} 3\n".encode(),
        )
        assert r.status_code == 200, r.text
        graph = flamegraph(c, '{service_name="deep"}', T0 - 10, T0 + 10)
        assert len(graph["levels"]) == 1 + 1000  # root + the 1,000 root-most frames
        assert "f999" in graph["names"] and "f1000" not in graph["names"]
    _still_intact(srv)


@pytest.mark.parametrize(
    "case",
    ["folded inf", "folded huge", "speedscope nan", "speedscope bad frame", "pprof negative"],
)
def test_out_of_range_values_are_refused(srv, case: str) -> None:  # type: ignore[no-untyped-def]
    params = {"name": "victim.cpu", "from": str(T0)}
    doc = (
        '{"shared": {"frames": [{"name": "a"}]}, "profiles": [{"type": "sampled", "unit": "none", '
    )
    body = {
        "folded inf": b"a;b inf\n",
        "folded huge": b"a;b 100000000000000000\n",
        "speedscope nan": (doc + '"samples": [[0]], "weights": [NaN]}]}').encode(),
        "speedscope bad frame": (doc + '"samples": [[-1]], "weights": [1]}]}').encode(),
        "pprof negative": make_pprof([(["neg"], -5, {})]),
    }[case]
    params["format"] = {
        "speedscope nan": "speedscope",
        "speedscope bad frame": "speedscope",
        "pprof negative": "pprof",
    }.get(case, "folded")
    with srv.client() as c:
        r = c.post("/ingest", params=params, content=body)
    assert r.status_code == 400, (case, r.text)
    _still_intact(srv)


def test_bad_numbers_in_queries(srv) -> None:  # type: ignore[no-untyped-def]
    with srv.client() as c:
        for step in ("NaN", "Infinity"):
            r = c.post(
                f"{QUERIER}/SelectSeries",
                json={
                    "profileTypeID": "a:b:c:d:e",
                    "labelSelector": "{}",
                    "step": step,
                    "start": "0",
                    "end": "1000",
                },
            )
            assert r.status_code == 400, r.text
        r = c.post(
            f"{QUERIER}/SelectMergeStacktraces",
            json={
                "profileTypeID": "a:b:c:d:e",
                "labelSelector": "{}",
                "start": "0",
                "end": "9000000000000000000",
            },
        )
        assert r.status_code == 400
        for bad in ({"until": "9999999999999999999"}, {"from": "now-99999999999w"}):
            r = c.get("/pyroscope/render", params={"query": "victim.cpu{}", **bad})
            assert r.status_code == 400, (bad, r.text)
        r = c.post(
            "/ingest",
            params={"name": "victim.cpu", "from": "9999999999999999999"},
            content=b"a;b 1\n",
        )
        assert r.status_code == 400
    _still_intact(srv)


def test_push_decompression_budget_is_per_request(srv) -> None:  # type: ignore[no-untyped-def]
    from hotspan.formats.proto import push_pb2, types_pb2

    # Each profile expands to 100 MiB; the 128 MiB budget covers one, not two.
    padding = 100 * 1024 * 1024  # a valid profile with a 100 MiB unknown field (skipped)
    varint = bytearray()
    n = padding
    while True:
        varint.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            break
    padded = valid_raw + b"\xa2\x06" + bytes(varint) + b"\0" * padding  # field 100, bytes
    bomb = gzip.compress(padded)
    req = push_pb2.PushRequest()
    series = req.series.add()
    series.labels.append(types_pb2.LabelPair(name="service_name", value="victim"))
    for _ in range(2):
        series.samples.add(raw_profile=bomb)
    with srv.client() as c:
        r = c.post(
            "/push.v1.PusherService/Push",
            content=req.SerializeToString(),
            headers={"content-type": "application/proto"},
        )
    assert r.status_code == 400 and "limit" in r.json()["message"]
    _still_intact(srv)


def test_a_binary_part_without_a_filename_is_read_as_sent(srv) -> None:  # type: ignore[no-untyped-def]
    """``curl -F "profile=<cpu.pprof"``: a part with no filename comes as a value, which must
    still be the bytes sent (Go's multipart reader, Pyroscope's, keeps them)."""
    raw = make_pprof([(["plain_part_fn", "main"], 77, {})], time_ns=T0 * 10**9)
    assert raw[:2] == b"\x1f\x8b"  # gzip: bytes no UTF-8 decoding keeps
    body = (
        b'--XX\r\nContent-Disposition: form-data; name="profile"\r\n\r\n' + raw + b"\r\n--XX--\r\n"
    )
    with srv.client() as c:
        r = c.post(
            "/ingest",
            params={"name": "plainpart{}", "from": str(T0)},
            content=body,
            headers={"content-type": "multipart/form-data; boundary=XX"},
        )
        assert r.status_code == 200, r.text
        graph = flamegraph(c, '{service_name="plainpart"}', T0 - 10, T0 + 10)
    assert function_totals(graph) == {"main": 77, "plain_part_fn": 77}


def test_a_sample_label_cannot_rename_the_series(srv) -> None:  # type: ignore[no-untyped-def]
    raw = make_pprof(
        [(["renamed_fn", "main"], 5, {"__name__": "evil", "ok": "1"})], time_ns=T0 * 10**9
    )
    with srv.client() as c:
        assert ingest_pprof(c, "labelled{}", raw, T0).status_code == 200
        names = c.post(
            f"{QUERIER}/LabelValues",
            json={"name": "__name__", "start": (T0 - 10) * 1000, "end": (T0 + 10) * 1000},
        ).json()
        graph = flamegraph(c, '{service_name="labelled", ok="1"}', T0 - 10, T0 + 10)
    assert "evil" not in names.get("names", [])
    assert function_totals(graph) == {"main": 5, "renamed_fn": 5}


def test_a_lone_surrogate_in_json_is_refused_and_lists_still_load(srv) -> None:  # type: ignore[no-untyped-def]
    # JSON may escape a lone surrogate, which no UTF-8 writer (the store, the next answer)
    # takes: refused with a 400 before anything is kept.
    s = "\\ud800"
    cases = [
        (
            "PUT",
            "/api/v1/recording-rules/r1",
            '{"metricName": "profiles_recorded_x", "selector": "{service_name=\\"a' + s + '\\"}"}',
        ),
        (
            "POST",
            "/settings.v1.RecordingRulesService/UpsertRecordingRule",
            '{"metricName": "profiles_recorded_y", "matchers": '
            '["{__profile_type__=\\"process_cpu:cpu:nanoseconds:cpu:nanoseconds\\"}"], '
            '"stacktraceFilter": {"functionName": {"functionName": "' + s + '"}}}',
        ),
        (
            "PUT",
            "/api/v1/settings/svc",
            '{"settings": {"enabled": false}, "selector": "{k=\\"' + s + '\\"}"}',
        ),
        (
            "POST",
            "/settings.v1.SettingsService/Set",
            '{"setting": {"name": "' + s + '", "value": "v"}}',
        ),
        (
            "POST",
            "/adhocprofiles.v1.AdHocProfileService/Upload",
            '{"name": "x", "profile": "' + s + '"}',
        ),
    ]
    with srv.client() as c:
        for method, path, body in cases:
            r = c.request(
                method, path, content=body.encode(), headers={"content-type": "application/json"}
            )
            assert r.status_code == 400, (path, r.status_code, r.text)
            assert "UTF-8" in r.text or "base64" in r.text, r.text
        for path in ("/api/v1/recording-rules", "/api/v1/settings"):
            assert c.get(path).status_code == 200, path
        assert c.post("/settings.v1.SettingsService/Get", json={}).status_code == 200


def test_numbers_json_does_not_have_are_refused(srv) -> None:  # type: ignore[no-untyped-def]
    # 1e400 reads as infinity in Python, and Python reads NaN and Infinity, which JSON does not
    # have: a 400 before any handler converts them (int(inf) was a 500).
    cases = [
        (
            "/adhocprofiles.v1.AdHocProfileService/Upload",
            '{"name": "x.folded", "profile": "bWFpbjtmb28gMTAK", "maxNodes": 1e400}',
        ),
        ("/adhocprofiles.v1.AdHocProfileService/Get", '{"id": "x", "maxNodes": -1e400}'),
        ("/adhocprofiles.v1.AdHocProfileService/Get", '{"id": "x", "max_nodes": NaN}'),
        (
            "/settings.v1.SettingsService/Set",
            '{"setting": {"name": "a", "value": "v", "modifiedAt": Infinity}}',
        ),
    ]
    with srv.client() as c:
        for path, body in cases:
            r = c.post(path, content=body.encode(), headers={"content-type": "application/json"})
            assert r.status_code == 400, (path, body, r.status_code, r.text)
            assert "out of range" in r.text or "not a JSON number" in r.text, r.text
        r = c.post(
            "/adhocprofiles.v1.AdHocProfileService/Upload",
            json={"name": "x.folded", "profile": "bWFpbjtmb28gMTAK", "maxNodes": 1e300},
        )
        assert r.status_code == 400 and "max flamegraph nodes" in r.text, r.text
