"""The program's pauses while the agent uploads to a server some way off.

A busy asyncio loop (a ~0.2 ms unit of pure-Python work, then a yield to the loop, over and
over) measures the time between its turns for ``--seconds``, with no profiler and with the
agent uploading every second (``upload_interval=1``, 100 Hz, every default on) to a real
``hotspan server`` through a TCP proxy that holds each chunk of the server's answers
``--delays`` milliseconds (a server that far away; 0: beside it).  With ``--compare-src DIR``
the agent also runs imported from another checkout (its C extensions built there with
``python setup.py build_ext --inplace``): before and after in one run.  Rounds interleave every
setting; each run is a fresh process.

What is reported per setting: the longest pause of the loop and the 99.99th percentile, the
pauses over 20 and 50 ms in the run, the loop's turns per second against no profiler's, the
uploads sent, the sample rate in force at the end (the agent's governor halves it when the
agent costs more than its budget) and the turns at the GIL the agent's threads were given.

    python bench/agent_upload_stall.py [--seconds 10] [--rounds 3] [--delays 0,50]
                                       [--compare-src DIR]

Writes ``bench/results/agent_upload_stall.{md,json}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

WORKLOAD = r"""
import asyncio, json, sys, time
seconds, server = float(sys.argv[1]), sys.argv[2]
agent = None
if server != "none":
    import hotspan
    agent = hotspan.configure(application_name="upload-stall", server_address=server,
                              upload_interval=1, sample_rate=100)

def spin(n):
    x = 0
    for i in range(n):
        x = (x * 31 + i) & 0xFFFFF
    return x

gaps = []

async def busy():
    last = start = time.monotonic()
    end = start + seconds
    while last < end:
        spin(1000)
        await asyncio.sleep(0)
        now = time.monotonic()
        gaps.append(now - last)
        last = now

asyncio.run(busy())
out = {"turns": len(gaps) / seconds}
if agent is not None:
    from hotspan._speedups import load_sampler
    native = load_sampler()
    turns = native.turns() if native is not None and hasattr(native, "turns") else None
    out.update(rate=agent._rate, turns_at_gil=turns)
    hotspan.shutdown()
    stats = agent.upload_stats
    out.update(sent=stats.sent_uploads, failed=stats.failed_attempts,
               dropped=stats.dropped_uploads)
gaps.sort()
out.update(
    max_ms=gaps[-1] * 1e3,
    p9999_ms=gaps[int(len(gaps) * 0.9999)] * 1e3,
    over20=sum(g > 0.02 for g in gaps),
    over50=sum(g > 0.05 for g in gaps),
)
print(json.dumps(out))
"""


class DelayProxy:
    """127.0.0.1:port → the server; each chunk of the server's answer waits ``delay`` s."""

    def __init__(self, target: Tuple[str, int], delay: float) -> None:
        self.target, self.delay = target, delay
        self.port = 0
        self._ready = threading.Event()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        threading.Thread(target=self._run, daemon=True).start()
        self._ready.wait(10)

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await server.serve_forever()

    async def _pipe(self, reader: Any, writer: Any, delay: float) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if delay:
                    await asyncio.sleep(delay)
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def _handle(self, client_r: Any, client_w: Any) -> None:
        server_r, server_w = await asyncio.open_connection(*self.target)
        await asyncio.gather(
            self._pipe(client_r, server_w, 0), self._pipe(server_r, client_w, self.delay)
        )


def run_one(src: Optional[str], server: str, seconds: float) -> Dict[str, Any]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src
    out = subprocess.run(
        [sys.executable, "-c", WORKLOAD, str(seconds), server],
        capture_output=True,
        text=True,
        env=env,
        timeout=seconds * 4 + 60,
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def summarize(runs: List[Dict[str, Any]], baseline: List[Dict[str, Any]]) -> Dict[str, Any]:
    def med(key: str) -> Any:
        values = [r[key] for r in runs if r.get(key) is not None]
        return statistics.median(values) if values else None

    base = statistics.median(r["turns"] for r in baseline)
    return {
        "max_ms": max(r["max_ms"] for r in runs),
        "median_max_ms": med("max_ms"),
        "p9999_ms": med("p9999_ms"),
        "over20": med("over20"),
        "over50": med("over50"),
        "turns_vs_none": med("turns") / base - 1 if base else None,
        "sent": med("sent"),
        "failed": med("failed"),
        "rates": sorted({r.get("rate") for r in runs if r.get("rate") is not None}),
        "turns_at_gil": [r.get("turns_at_gil") for r in runs],
    }


def markdown(result: Dict[str, Any], command: str, m: Dict[str, Any], wall: float) -> str:
    lines = common.head(
        "The program's pauses while the agent uploads", command, wall, common.machine_text(m)
    )
    lines += [
        "",
        f"{result['rounds']} interleaved rounds of {result['seconds']:g} s each. Pauses: the "
        "time between two turns of the busy loop (a ~0.2 ms unit of work each); max over the "
        "rounds, the others medians of the rounds. `loop turns/s` is against no profiler in "
        "the same delay. `rate` is the agent's sample rate at the end of each run (100 asked: "
        "50 means its governor found it over its 1% budget).",
        "",
        "| server answers after | setting | longest pause ms (median of rounds) "
        "| p99.99 ms | pauses > 20 ms | > 50 ms | loop turns/s | uploads sent (failed) | rate |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for delay, settings in result["delays"].items():
        for name, s in settings.items():
            turns = s["turns_vs_none"]
            sent = "" if s["sent"] is None else f"{s['sent']:g} ({s['failed']:g})"
            lines.append(
                f"| {delay} ms | {name} | {s['max_ms']:.1f} ({s['median_max_ms']:.1f}) "
                f"| {s['p9999_ms']:.2f} | {s['over20']:g} | {s['over50']:g} "
                f"| {'' if name == 'none' else f'{turns * 100:+.1f}%'} | {sent} "
                f"| {', '.join(str(r) for r in s['rates'])} |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--delays", default="0,50", help="ms the proxy holds each answer chunk")
    ap.add_argument("--compare-src", default=None, help="another checkout's src/ to run too")
    ap.add_argument("--out", default=common.RESULTS_DIR)
    args = ap.parse_args()
    t0 = time.perf_counter()
    report: Dict[str, Any] = {"command": common.command_line(__file__)}
    report["machine"] = common.machine()
    delays = [int(d) for d in args.delays.split(",")]
    settings: Dict[str, Optional[str]] = {"none": None, "hotspan": common.REPO_DIR + "/src"}
    if args.compare_src:
        settings[f"hotspan from {args.compare_src}"] = args.compare_src
    runs: Dict[int, Dict[str, List[Dict[str, Any]]]] = {
        d: {name: [] for name in settings} for d in delays
    }
    with tempfile.TemporaryDirectory() as work:
        server = common.Server(os.path.join(work, "data")).start()
        try:
            proxies = {d: DelayProxy((server.host, server.port), d / 1000) for d in delays}
            for r in range(args.rounds):
                order = [(d, name) for d in delays for name in settings]
                random.shuffle(order)
                for d, name in order:
                    target = "none" if name == "none" else f"http://127.0.0.1:{proxies[d].port}"
                    src = settings[name] or common.REPO_DIR + "/src"
                    run = run_one(src, target, args.seconds)
                    runs[d][name].append(run)
                    common.log(f"round {r + 1}, {d} ms, {name}: {json.dumps(run)}")
        finally:
            server.stop()
    result: Dict[str, Any] = {
        "seconds": args.seconds,
        "rounds": args.rounds,
        "delays": {
            str(d): {name: summarize(rs, runs[d]["none"]) for name, rs in per.items()}
            for d, per in runs.items()
        },
        "runs": {str(d): per for d, per in runs.items()},
    }
    return common.finish_run("agent_upload_stall", result, report, t0, markdown, args.out)


if __name__ == "__main__":
    sys.exit(main())
