"""What every client command shares: selectors as users type them, profile type names, and
time ranges (checked here without a server; the commands' tests use a real one)."""

from __future__ import annotations

import argparse

import pytest

from hotspan.cli.client import (
    CLIError,
    add_time_options,
    args_time_range,
    profile_type_id,
    selector_query,
    time_ms,
    time_range,
)

NOW = 1_764_000_000_000  # ms


@pytest.mark.parametrize(
    "typed, sent",
    [
        ("my-service{commit=abc123}", '{service_name="my-service", commit="abc123"}'),
        ("my-service", '{service_name="my-service"}'),
        ("svc.v2 {env=prod, pod=~web-.*}", '{service_name="svc.v2", env="prod", pod=~"web-.*"}'),
        ('svc{a!="b c", d!~x}', '{service_name="svc", a!="b c", d!~"x"}'),
        ('{service_name="x", a=~"b.*"}', '{service_name="x", a=~"b.*"}'),
        ("{}", "{}"),
    ],
)
def test_selectors_as_users_type_them(typed: str, sent: str) -> None:
    assert selector_query(typed) == sent


@pytest.mark.parametrize(
    "typed, reason",
    [
        ("prog{commit=a", "has no closing '}'"),
        ('{a="b"', "expected ',' or '}'"),
        ("{a}", "expected one of"),
        ("svc{a=1}x", "unexpected"),
    ],
)
def test_bad_selectors_name_the_problem(typed: str, reason: str) -> None:
    with pytest.raises(CLIError) as caught:
        selector_query(typed)
    assert caught.value.code == 2
    assert typed in str(caught.value) and reason in str(caught.value)


def test_profile_types_by_alias_or_id() -> None:
    assert profile_type_id("cpu") == "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
    assert profile_type_id("inuse_space") == "memory:inuse_space:bytes:space:bytes"
    full = "memory:alloc_space:bytes:space:bytes"
    assert profile_type_id(full) == full
    with pytest.raises(CLIError) as caught:
        profile_type_id("cpux")
    assert caught.value.code == 2 and "'cpux'" in str(caught.value)


@pytest.mark.parametrize(
    "text, ms",
    [
        ("now", NOW),
        ("now-1h", NOW - 3_600_000),
        ("now-1d12h", NOW - 129_600_000),
        ("1764000000", NOW),  # unix seconds
        ("1764000000000", NOW),  # unix milliseconds
        ("2025-11-24T16:00:00Z", NOW),
        ("2025-11-24T17:00:00+01:00", NOW),
    ],
)
def test_times(text: str, ms: int) -> None:
    assert time_ms(text, NOW) == ms


def test_ranges() -> None:
    assert time_range(None, None, None, "1h", now_ms=NOW) == time_range(
        "1h", None, None, now_ms=NOW
    )
    window = time_range(None, "now-2h", "now-1h", now_ms=NOW)
    assert (window.start_ms, window.end_ms) == (NOW - 7_200_000, NOW - 3_600_000)
    for bad in (("1h", "now-2h", None), (None, "now", "now-1h"), ("0", None, None)):
        with pytest.raises(CLIError) as caught:
            time_range(*bad, now_ms=NOW)
        assert caught.value.code == 2
    with pytest.raises(CLIError, match="not a time"):
        time_range(None, "yesterday", None, now_ms=NOW)


def test_a_side_range_replaces_the_shared_start() -> None:
    parser = argparse.ArgumentParser()
    add_time_options(parser)
    for side in ("baseline", "comparison"):
        parser.add_argument(f"--{side}-time-range")
        parser.add_argument(f"--{side}-from", dest=f"{side}_from_")
        parser.add_argument(f"--{side}-until")
    args = parser.parse_args(["--time-range", "1h", "--baseline-from", "2025-11-23T16:00:00Z"])
    baseline = args_time_range(args, prefix="baseline_")
    comparison = args_time_range(args, prefix="comparison_")
    assert comparison.end_ms - comparison.start_ms == 3_600_000
    assert baseline.start_ms == NOW - 86_400_000
    args = parser.parse_args(["--baseline-time-range", "1h", "--baseline-from", "now-2h"])
    with pytest.raises(CLIError, match="--baseline-time-range"):
        args_time_range(args, prefix="baseline_")


def test_the_top_table_prints_names_as_they_are() -> None:
    # Frame names are text, not rich markup: "[/b]" raised, "[bold]" would have vanished.
    from hotspan.cli.client import TimeRange
    from hotspan.cli.query import top_table
    from hotspan.model.profile import Frame
    from hotspan.model.stack_profile import SampleType, StackProfile

    profile = StackProfile([SampleType("cpu", "nanoseconds", "process_cpu")])
    profile.add([Frame("main"), Frame("parse[/b]")], [30])
    profile.add([Frame("main"), Frame("[bold]render")], [10])
    text = top_table(profile, "{}", "cpu", TimeRange(0, 1000), 10, to_stdout=False)
    assert "parse[/b]" in text and "[bold]render" in text


class _Answers:
    """A server on 127.0.0.1 that answers every request with the same raw bytes: what a
    broken server, or something that is no HTTP server, sends."""

    def __init__(self, raw: bytes) -> None:
        import socket
        import threading

        self.raw = raw
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(self.raw)

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize(
    "raw, said",
    [
        (b"SSH-2.0-OpenSSH_9.2\r\n", "not a valid HTTP answer"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}", "not a valid HTTP answer"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n[1, 2]", "not a JSON object"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n{x]", "not JSON"),
        (
            b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 41\r\n\r\n"
            b"<html>\n<body>\n<h1>502</h1>\n</body></html>",
            "502 <html> <body> <h1>502</h1>",
        ),
    ],
)
def test_a_broken_server_is_one_line_not_a_traceback(
    raw: bytes, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from hotspan.cli import main

    server = _Answers(raw)
    try:
        for argv in (["alerts", "list"], ["tokens", "list"], ["settings", "get", "svc"]):
            assert main([*argv, "--server", server.url]) == 1, argv
            err = capsys.readouterr().err
            assert said in err and "Traceback" not in err, (argv, err)
            assert len(err.strip().splitlines()) == 1, err
    finally:
        server.close()


@pytest.mark.parametrize("url", ["http://[::1", "http://127.0.0.1:1/ a b"])
def test_a_url_urllib_cannot_use_is_a_bad_argument(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from hotspan.cli import main

    assert main(["alerts", "list", "--server", url]) == 2
    err = capsys.readouterr().err
    assert "--server" in err and "Traceback" not in err, err
