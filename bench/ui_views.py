"""UI benchmark, second part: the web UI's heavy views against a real server and real data.

The data set is the traces benchmark's (``bench/traces.py``, its ``--quick`` size: 100k spans
of 8 services over 24 h, and CPU profiles whose samples carry the spans' ids), built once and
cached.  A ``hotspan server`` serves it; for each view the API call behind it is timed over
HTTP, then the page is opened in headless Chromium and timed from navigation start until the
view is drawn (``performance.now()`` when the page's own condition first holds, checked every
animation frame):

- profiles: ``/profiles`` of one service, until its flame graph is drawn (the yardstick);
- sandwich: the same with ``sandwich=<function>``, until its callers' graph is drawn;
- label breakdown: ``/profiles`` grouped by ``pod`` in the breakdown view, until the small
  timelines are there;
- endpoints: ``/endpoints`` of one service (``GET /api/v1/endpoints``), until its rows are;
- diff of two spans: ``/diff`` of two root spans with their descendants, until drawn.

A view this checkout does not have (no element, no route, an API answering 404) is skipped
and named as such, so the benchmark runs on any branch.
"""

from __future__ import annotations

import json
import statistics
from typing import Callable, Dict, List, Optional
from urllib.parse import urlencode

import common
import traces

CPU = traces.CPU
QUERIER = "/querier.v1.QuerierService"
PAGE_TIMEOUT_MS = 30_000

# Conditions checked in the page every frame: "ready" when the view is drawn, "absent" when
# the page is done but this checkout has no such view, false while it is loading.
FLAME = """(root) => {
  const host = [...document.querySelectorAll(root + ' .hs-flamegraph')].find((e) => e.flamegraph);
  return Boolean(host && host.flamegraph.frames().length > 1);
}"""
READY: Dict[str, str] = {
    "profiles": f"""() => ({FLAME})('.hs-main') ? "ready" : false""",
    "sandwich": f"""() => {{
      const callers = document.querySelector('.hs-sandwich-callers.hs-flamegraph');
      if (callers && callers.flamegraph && callers.flamegraph.frames().length > 0) return "ready";
      if (({FLAME})('.hs-main') && !document.querySelector('.hs-panel-sandwich')) return "absent";
      return false;
    }}""",
    "breakdown": f"""() => {{
      if (document.querySelectorAll('.hs-breakdown-card canvas').length >= 2) return "ready";
      if (({FLAME})('.hs-main') && !document.querySelector('.hs-breakdown-slot')) return "absent";
      return false;
    }}""",
    "endpoints": """() => {
      if (document.querySelector('.hs-ep-row')) return "ready";
      const lost = [...document.querySelectorAll('.hs-message')].some(
        (m) => m.textContent.startsWith('No page at'));
      return lost ? "absent" : false;
    }""",
    "diff": f"""() => ({FLAME})('.hs-diff-profile') ? "ready" : false""",
}
LABELS = {
    "profiles": "profiles (flame graph of one service)",
    "sandwich": "sandwich view (callers and callees of one function)",
    "breakdown": "label breakdown (one timeline per pod)",
    "endpoints": "endpoints (per-endpoint table)",
    "diff": "diff of two spans (with descendants)",
}


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


class _Api:
    """The API calls behind the views, each timed; None when the server has no such API."""

    def __init__(self, url: str, start_ms: int, end_ms: int) -> None:
        # Compressed answers where the server compresses, as the browser gets them.
        self.client = common.Client(url, timeout=120, accept_encoding=None)
        self.start_ms, self.end_ms = start_ms, end_ms

    def querier(self, method: str, body: dict) -> Optional[dict]:
        return self.client.answer_or_none("POST", f"{QUERIER}/{method}", body)

    def get(self, path: str, **params: object) -> Optional[dict]:
        query = urlencode({k: v for k, v in params.items() if v is not None}, doseq=True)
        return self.client.answer_or_none("GET", f"{path}?{query}" if query else path)

    def flamegraph(self, service: str) -> Optional[dict]:
        return self.querier(
            "SelectMergeStacktraces",
            {
                "profileTypeID": CPU,
                "labelSelector": f'{{service_name="{service}"}}',
                "start": self.start_ms,
                "end": self.end_ms,
            },
        )

    def breakdown(self) -> Optional[dict]:
        step_s = max((self.end_ms - self.start_ms) / 1000 / 120, 1)
        return self.querier(
            "SelectSeries",
            {
                "profileTypeID": CPU,
                "labelSelector": '{env="production"}',
                "start": self.start_ms,
                "end": self.end_ms,
                "step": step_s,
                "groupBy": ["pod"],
            },
        )

    def endpoints(self, service: str) -> Optional[dict]:
        return self.get(
            "/api/v1/endpoints",
            service=service,
            profileType=CPU,
            start=self.start_ms // 1000,
            end=-(-self.end_ms // 1000),
        )

    def span_with_descendants(self, trace_id: str) -> Optional[Dict[str, object]]:
        """The trace's root span and its descendants' ids, as the diff page sends them."""
        found = self.get(f"/api/traces/{trace_id}/spans")
        if not found or not found.get("spans"):
            return None
        spans = found["spans"]
        ids = {s["spanID"] for s in spans}
        root = next(s for s in spans if s["parentSpanID"] not in ids)
        starts = [int(s["startTimeUnixNano"]) // 10**6 for s in spans]
        return {
            "trace": trace_id,
            "span": root["spanID"],
            "ids": sorted(ids),  # every span of the trace descends from its root
            "total": found.get("total", 0),
            "from": (min(starts) - 3600_000) // 1000,
            "until": (max(starts) + 3600_000) // 1000,
        }

    def diff(self, left: Dict[str, object], right: Dict[str, object]) -> Optional[dict]:
        def side(s: Dict[str, object]) -> dict:
            return {
                "profileTypeID": CPU,
                "labelSelector": "{}",
                "start": int(s["from"]) * 1000,  # type: ignore[call-overload]
                "end": int(s["until"]) * 1000,  # type: ignore[call-overload]
                "traceIdSelector": [s["trace"]],
                "spanSelector": s["ids"],
            }

        return self.querier("Diff", {"left": side(left), "right": side(right)})


def _busiest_function(answer: dict) -> str:
    """The function with the most frames in a flame graph: the heaviest sandwich."""
    graph = answer["flamegraph"]
    counts: Dict[int, int] = {}
    for level in graph["levels"][1:]:
        values = level["values"]
        for i in range(3, len(values), 4):
            counts[int(values[i])] = counts.get(int(values[i]), 0) + 1
    return graph["names"][max(counts, key=lambda k: counts[k])]


def _timed(fn: Callable[[], object], repeat: int) -> Dict[str, object]:
    """The median of ``repeat`` calls after a warm-up (the server's caches, the connection)."""
    return {"api_ms": _ms(common.first_and_median(fn, repeat)[2])}


def _page_ms(page, url: str, ready: str, repeat: int) -> Dict[str, object]:  # type: ignore[no-untyped-def]
    times = []
    for run in range(repeat + 1):
        page.goto(url)
        handle = page.wait_for_function(ready, polling="raf", timeout=PAGE_TIMEOUT_MS)
        state = handle.json_value()
        took = page.evaluate("() => performance.now()")
        if state == "absent":
            return {"skipped": "this checkout has no such view"}
        if run:  # the first load fetches and compiles the modules
            times.append(took)
    return {"page_ms": round(statistics.median(times), 1)}


def run(quick: bool, log: Callable[[str], None], chromium: str) -> Dict[str, object]:
    from playwright.sync_api import sync_playwright

    repeat = 3 if quick else 7
    params = traces.QUICK
    data_dir, saved, reused = traces.ensure_data(params, log)
    targets: Dict[str, object] = saved["targets"]  # type: ignore[assignment]
    end_s = int(params["end_s"])
    start_s = end_s - int(params["hours"]) * 3600
    service = "frontend"
    rows: List[Dict[str, object]] = []
    out: Dict[str, object] = {
        "data_set": f"{params['spans']:,} spans over {params['hours']} h, 8 services",
        "data_reused": reused,
        "range": "the whole data set (24 h)",
        "repeat": repeat,
        "rows": rows,
    }
    with common.measured_server(data_dir) as (server, info):
        api = _Api(server.url, start_s * 1000, end_s * 1000)
        graph = api.flamegraph(service)
        assert graph is not None, "the querier answers 404"
        function = _busiest_function(graph)
        profile: Dict[str, str] = targets["profile"]  # type: ignore[assignment]
        lookup: List[str] = targets["lookup"]  # type: ignore[assignment]
        left = api.span_with_descendants(profile["trace_id"])
        right = next((s for s in map(api.span_with_descendants, lookup) if s and s["total"]), None)
        common_q = {"from": str(start_s), "until": str(end_s)}
        query = f'{{service_name="{service}"}}'
        plan: List[Dict[str, object]] = [
            {
                "view": "profiles",
                "api": lambda: api.flamegraph(service),
                "url": "/profiles?" + urlencode({"query": query, **common_q}),
            },
            {
                "view": "sandwich",
                "api": None,  # the profiles answer; the sandwich is built in the page
                "url": "/profiles?" + urlencode({"query": query, "sandwich": function, **common_q}),
                "note": f"on {function}",
            },
            {
                "view": "breakdown",
                "api": api.breakdown,
                "url": "/profiles?"
                + urlencode(
                    {
                        "query": '{env="production"}',
                        "groupBy": "pod",
                        "groupView": "breakdown",
                        **common_q,
                    }
                ),
            },
            {
                "view": "endpoints",
                "api": lambda: api.endpoints(service),
                "url": "/endpoints?" + urlencode({"query": query, **common_q}),
            },
        ]
        if left and right:
            plan.append(
                {
                    "view": "diff",
                    "api": lambda: api.diff(left, right),  # type: ignore[arg-type]
                    "url": "/diff?"
                    + urlencode(
                        {
                            "leftTraceId": left["trace"],
                            "leftSpanId": left["span"],
                            "leftFrom": left["from"],
                            "leftUntil": left["until"],
                            "rightTraceId": right["trace"],
                            "rightSpanId": right["span"],
                            "rightFrom": right["from"],
                            "rightUntil": right["until"],
                        }
                    ),
                    "note": f"{len(left['ids'])} and {len(right['ids'])} spans",  # type: ignore[arg-type]
                }
            )
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=chromium, args=["--no-sandbox", "--disable-dev-shm-usage"]
            )
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            for item in plan:
                view = str(item["view"])
                row: Dict[str, object] = {"view": view, "label": LABELS[view]}
                if item.get("note"):
                    row["note"] = item["note"]
                api_call = item["api"]
                if api_call is not None:
                    if api_call() is None:  # type: ignore[operator]
                        row["skipped"] = "the server has no such API"
                        rows.append(row)
                        log(f"  {view}: skipped ({row['skipped']})")
                        continue
                    row.update(_timed(api_call, repeat))  # type: ignore[arg-type]
                try:
                    row.update(_page_ms(page, server.url + str(item["url"]), READY[view], repeat))
                except Exception as exc:  # noqa: BLE001 - a view that never draws is a result
                    row["skipped"] = (
                        f"not drawn within {PAGE_TIMEOUT_MS // 1000} s ({type(exc).__name__})"
                    )
                rows.append(row)
                log(f"  {view}: {json.dumps({k: v for k, v in row.items() if k != 'label'})}")
            browser.close()
    out["server"] = {k: v for k, v in info.items() if k != "server_stderr"}
    return out


def markdown(result: Dict[str, object]) -> List[str]:
    lines = [
        "## Heavy views against a server",
        "",
        f"Data: the traces benchmark's data set ({result['data_set']}), range "
        f"{result['range']}; medians of {result['repeat']} runs after a warm-up. "
        '"API" is the HTTP call behind the view; "page" is navigation start to the view '
        "drawn in the page (HTML, modules, every API call the page makes, decode, draw).",
        "",
        "| view | API ms | page ms | note |",
        "|---|---:|---:|---|",
    ]
    for r in result["rows"]:  # type: ignore[union-attr]
        note = r.get("skipped") and f"skipped: {r['skipped']}" or r.get("note", "")
        lines.append(
            f"| {r['label']} | {r.get('api_ms', '–')} | {r.get('page_ms', '–')} | {note} |"
        )
    lines.append("")
    return lines
