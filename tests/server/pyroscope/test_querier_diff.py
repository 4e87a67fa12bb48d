"""The querier's Diff narrows each side by trace ids and span ids, as SelectMergeStacktraces
does: the web UI compares two spans (with their descendants, which it lists) or two traces."""

from __future__ import annotations

from typing import Dict, Tuple

from tests.helpers import CPU, QUERIER, ingest_pprof, make_pprof

T0 = 1_700_000_000
TRACE_A = "0af7651916cd43dd8448eb211c80319c"
TRACE_B = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN_A = "00000000000000a1"
SPAN_A_CHILD = "00000000000000a2"
SPAN_B = "00000000000000b1"


def side(**extra) -> dict:  # type: ignore[no-untyped-def]
    return {
        "profileTypeID": CPU,
        "labelSelector": '{service_name="shop"}',
        "start": (T0 - 60) * 1000,
        "end": (T0 + 60) * 1000,
        **extra,
    }


def nodes(graph: dict) -> Dict[str, Tuple[int, int]]:
    """Function name -> (left total, right total), from the diff's 7-int node encoding."""
    out: Dict[str, Tuple[int, int]] = {}
    for level in graph["levels"][1:]:
        v = [int(x) for x in level["values"]]
        for i in range(0, len(v), 7):
            name = graph["names"][v[i + 6]]
            left, right = out.get(name, (0, 0))
            out[name] = (left + v[i + 1], right + v[i + 4])
    return out


def diff(client, left: dict, right: dict) -> dict:  # type: ignore[no-untyped-def]
    r = client.post(f"{QUERIER}/Diff", json={"left": left, "right": right})
    assert r.status_code == 200, r.text
    return r.json()["flamegraph"]


def test_diff_of_two_spans_and_of_two_traces(server) -> None:  # type: ignore[no-untyped-def]
    samples = [
        (["render", "handle", "main"], 10, {"trace_id": TRACE_A, "span_id": SPAN_A}),
        (["query", "handle", "main"], 5, {"trace_id": TRACE_A, "span_id": SPAN_A_CHILD}),
        (["render", "handle", "main"], 100, {"trace_id": TRACE_B, "span_id": SPAN_B}),
        (["idle", "main"], 1000, {}),
    ]
    with server.client() as c:
        r = ingest_pprof(c, "shop{}", make_pprof(samples, time_ns=T0 * 10**9), T0)
        assert r.status_code == 200, r.text

        # Two spans: the rest of the service (idle) is on neither side.
        graph = diff(c, side(spanSelector=[SPAN_A]), side(spanSelector=[SPAN_B]))
        assert (int(graph["leftTicks"]), int(graph["rightTicks"])) == (10, 100)
        assert nodes(graph)["render"] == (10, 100)
        assert "idle" not in nodes(graph) and "query" not in nodes(graph)

        # A span with its descendant, as the UI sends it, and the trace id beside it.
        graph = diff(
            c,
            side(spanSelector=[SPAN_A, SPAN_A_CHILD], traceIdSelector=[TRACE_A]),
            side(spanSelector=[SPAN_B], traceIdSelector=[TRACE_B]),
        )
        assert nodes(graph)["query"] == (5, 0)
        assert (int(graph["leftTicks"]), int(graph["rightTicks"])) == (15, 100)

        # Two whole traces.
        graph = diff(c, side(traceIdSelector=[TRACE_A]), side(traceIdSelector=[TRACE_B]))
        assert (int(graph["leftTicks"]), int(graph["rightTicks"])) == (15, 100)

        # A span of another trace than the one named is no sample of it: an empty side.
        graph = diff(c, side(spanSelector=[SPAN_B], traceIdSelector=[TRACE_A]), side())
        assert int(graph.get("leftTicks", 0)) == 0 and int(graph["rightTicks"]) == 1115


def test_diff_refuses_a_bad_span_id_on_either_side(server) -> None:  # type: ignore[no-untyped-def]
    with server.client() as c:
        for left, right in ((["xyz"], [SPAN_B]), ([SPAN_A], ["12"])):
            r = c.post(
                f"{QUERIER}/Diff",
                json={"left": side(spanSelector=left), "right": side(spanSelector=right)},
            )
            assert r.status_code == 400, r.text
            assert "16 hex digits" in r.text
