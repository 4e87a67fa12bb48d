"""Label selectors, profile types and the /ingest parameter conventions."""

from __future__ import annotations

import pytest

from hotspan.formats import folded, ingest_params, speedscope
from hotspan.formats.compression import gunzip
from hotspan.formats.errors import FormatError
from hotspan.model.labels import SelectorError, parse_selector
from hotspan.model.profile import ProfileType, ProfileTypeError, stack_id


def test_selector_operators() -> None:
    sel = parse_selector('{service_name="api", env!="dev", pod=~"web-.*", zone!~"eu.*"}')
    assert sel.matches({"service_name": "api", "env": "prod", "pod": "web-1", "zone": "us"})
    assert not sel.matches({"service_name": "api", "env": "dev", "pod": "web-1", "zone": "us"})
    assert not sel.matches({"service_name": "api", "env": "prod", "pod": "xweb-1", "zone": "us"})
    assert not sel.matches({"service_name": "api", "env": "prod", "pod": "web-1", "zone": "eu1"})


def test_selector_metric_escapes_and_empty() -> None:
    sel = parse_selector('process_cpu:cpu:nanoseconds:cpu:nanoseconds{a="x\\"y"}')
    assert sel.metric == "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
    assert sel.matches({"a": 'x"y'})
    assert parse_selector("{}").matchers == ()
    assert parse_selector("").matchers == ()
    # A missing label equals the empty string, as in Prometheus.
    assert parse_selector('{a=""}').matches({})
    assert parse_selector('{a!=""}').matches({}) is False


def test_quoted_names_as_prometheus_3_writes_them() -> None:
    # Label names outside the old character set (what Pyroscope's Node SDK sends as tags).
    sel = parse_selector('{"otel.scope.name"="com.grafana.pyroscope/nodejs", env="prod"}')
    assert sel.matches({"otel.scope.name": "com.grafana.pyroscope/nodejs", "env": "prod"})
    assert not sel.matches({"otel.scope.name": "other", "env": "prod"})
    sel = parse_selector('{"app.cpu", "k8s.pod"=~"web-.*"}')
    assert sel.metric == "app.cpu" and sel.matches({"k8s.pod": "web-1"})
    assert parse_selector('{"a b"="c"}').matches({"a b": "c"})


@pytest.mark.parametrize(
    "bad",
    [
        '{a="b"',
        '{a~"b"}',
        '{a="b" c="d"}',
        '{="b"}',
        '{a="b"} x',
        '{a=~"("}',
        "{a=b}",
        'm{"n"}',
        '{"m", "n"}',
        '{"a"="b"',
    ],
)
def test_bad_selectors_say_why(bad: str) -> None:
    with pytest.raises(SelectorError):
        parse_selector(bad)


def test_profile_type_ids() -> None:
    pt = ProfileType.parse("memory:alloc_space:bytes:space:bytes")
    assert (pt.name, pt.sample_type, pt.period_unit) == ("memory", "alloc_space", "bytes")
    assert pt.id == "memory:alloc_space:bytes:space:bytes"
    with pytest.raises(ProfileTypeError):
        ProfileType.parse("cpu")


def test_stack_ids_are_stable_content_hashes() -> None:
    assert stack_id([1, 2, 3]) == stack_id([1, 2, 3])
    assert stack_id([1, 2, 3]) != stack_id([3, 2, 1])
    assert -(1 << 63) <= stack_id([5]) < (1 << 63)


@pytest.mark.parametrize(
    "value,expected_ns",
    [
        ("1700000000", 1700000000 * 10**9),
        ("1700000000123", 1700000000123 * 10**6),
        ("1700000000123456", 1700000000123456 * 10**3),
        ("1700000000123456789", 1700000000123456789),
    ],
)
def test_time_units_by_digit_count(value: str, expected_ns: int) -> None:
    assert ingest_params.parse_time(value, 0) == expected_ns


def test_bad_times() -> None:
    with pytest.raises(FormatError):
        ingest_params.parse_time("yesterday", 0)
    with pytest.raises(FormatError):
        ingest_params.parse_time("1" * 25, 0)
    assert ingest_params.parse_time(None, 42) == 42


def test_app_names() -> None:
    app = ingest_params.parse_app_name("my.app.cpu{env=prod, region = us}")
    assert app.name == "my.app.cpu" and app.tags == {"env": "prod", "region": "us"}
    assert ingest_params.split_suffix(app.name) == ("my.app", "cpu")
    assert ingest_params.split_suffix("plain") == ("plain", "cpu")
    with pytest.raises(FormatError):
        ingest_params.parse_app_name("{env=prod}")
    with pytest.raises(FormatError):
        ingest_params.parse_app_name("app{novalue}")


def test_legacy_cpu_counts_become_nanoseconds() -> None:
    t = ingest_params.legacy_type("cpu", 100)
    assert (t.metric, t.sample_type, t.sample_unit, t.scale) == (
        "process_cpu",
        "cpu",
        "nanoseconds",
        10_000_000,
    )
    t = ingest_params.legacy_type("alloc_space", 100)
    assert (t.metric, t.sample_type, t.sample_unit, t.scale) == (
        "memory",
        "alloc_space",
        "bytes",
        1,
    )


def test_folded_parsing() -> None:
    got = list(folded.parse_folded(b"a;b;c 10\n\na;b 2\nx;y 0\n"))
    assert got == [(["a", "b", "c"], 10), (["a", "b"], 2)]
    with pytest.raises(FormatError, match="line 1"):
        list(folded.parse_folded(b"a;b;c ten\n"))
    with pytest.raises(FormatError):
        list(folded.parse_folded(b"nospace\n"))
    assert list(folded.parse_lines(b"a;b\na;b\n")) == [(["a", "b"], 1), (["a", "b"], 1)]


def test_speedscope_sampled_and_evented() -> None:
    doc = b"""{"shared": {"frames": [{"name": "a"}, {"name": "b"}]}, "profiles": [
      {"type": "sampled", "name": "p", "unit": "milliseconds", "samples": [[0, 1], [0]],
       "weights": [3, 4]},
      {"type": "evented", "name": "e", "unit": "nanoseconds", "startValue": 0, "endValue": 10,
       "events": [{"type": "O", "frame": 0, "at": 0}, {"type": "O", "frame": 1, "at": 2},
                  {"type": "C", "frame": 1, "at": 7}, {"type": "C", "frame": 0, "at": 10}]}]}"""
    profiles = {p.name: p for p in speedscope.parse(doc)}
    assert profiles["p"].stacks == {("a", "b"): 3, ("a",): 4}
    assert profiles["e"].stacks == {("a",): 5, ("a", "b"): 5}
    with pytest.raises(FormatError):
        speedscope.parse(b"{}")
    with pytest.raises(FormatError):
        speedscope.parse(b'{"shared": {"frames": []}, "profiles": [{"type": "x"}]}')


def test_gunzip_is_bounded() -> None:
    import gzip

    bomb = gzip.compress(b"\0" * 1_000_000)
    assert len(gunzip(bomb, 2_000_000)) == 1_000_000
    with pytest.raises(FormatError, match="limit"):
        gunzip(bomb, 1000)
    with pytest.raises(FormatError):
        gunzip(bomb[: len(bomb) // 2], 2_000_000)
    with pytest.raises(FormatError):
        gunzip(b"\x1f\x8bnot gzip at all", 1000)
