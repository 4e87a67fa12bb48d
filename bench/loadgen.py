"""A cheap HTTP/1.1 load generator, run as its own process.

Requests are pre-built byte strings (request line, headers and body) written to keep-alive
connections with asyncio streams (uvloop when available); each connection has one request in
flight, so ``--concurrency`` is the number of in-flight requests.  Responses are read by
Content-Length.  It prints ``measure-start`` / ``measure-end`` lines so the parent can read
the server's CPU counters over exactly the measured window, then one JSON line of results.

    python bench/loadgen.py --host H --port P --requests FILE.pickle --concurrency 32 \
        --warmup 3 --duration 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pickle
import subprocess
import sys
import time
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple, TypeVar
from urllib.parse import quote

T = TypeVar("T")


def request_bytes(
    method: str,
    host: str,
    port: int,
    path: str,
    body: bytes = b"",
    headers: Optional[Dict[str, str]] = None,
) -> bytes:
    """One request as this load generator writes it: request line, ``Host``, ``headers``
    (``User-Agent: hotspan-bench`` unless they name one), ``Content-Length`` (unless the body
    is already chunked, or a GET has none) and the body."""
    fields = {"Host": f"{host}:{port}", **(headers or {})}
    fields.setdefault("User-Agent", "hotspan-bench")
    if "Transfer-Encoding" not in fields and (body or method not in ("GET", "HEAD")):
        fields["Content-Length"] = str(len(body))
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items())
    return (head + "\r\n").encode() + body


def post(host: str, port: int, path: str, body: bytes, content_type: str) -> bytes:
    """A POST of ``body`` as ``content_type`` (``request_bytes``)."""
    return request_bytes("POST", host, port, path, body, {"Content-Type": content_type})


def ingest_pprof(
    host: str, port: int, name: str, from_s: int, until_s: int, body: bytes, spy: str
) -> bytes:
    """Pyroscope's ``POST /ingest`` of a pprof body; ``name`` is ``app{label=value,...}``."""
    path = (
        f"/ingest?name={quote(name, safe='')}&from={from_s}&until={until_s}"
        f"&format=pprof&spyName={spy}&sampleRate=100"
    )
    return post(host, port, path, body, "application/octet-stream")


def latency_pcts(seconds: List[float]) -> Dict[str, float]:
    """p50, p90, p99 and max of request latencies, in ms."""
    lat = sorted(seconds)

    def pct(p: float) -> float:
        return round(lat[min(int(len(lat) * p / 100), len(lat) - 1)] * 1000, 2) if lat else 0.0

    return {"p50": pct(50), "p90": pct(90), "p99": pct(99), "max": pct(100)}


async def mark_window(
    loop: asyncio.AbstractEventLoop,
    t_measure: float,
    t_end: Optional[float],
    stats: Dict[str, object],
) -> None:
    """Prints ``measure-start`` at ``t_measure`` and ``measure-end`` at ``t_end`` (loop time;
    no end mark when None), for the parent to read the server's CPU over exactly that window;
    the load generator's own CPU in between goes into ``stats``."""
    await asyncio.sleep(max(t_measure - loop.time(), 0))
    print("measure-start", flush=True)
    cpu0 = time.process_time()
    if t_end is not None:
        await asyncio.sleep(max(t_end - loop.time(), 0))
        print("measure-end", flush=True)
    stats["loadgen_cpu_s"] = round(time.process_time() - cpu0, 2)


def run_loop(main: Awaitable[T]) -> T:
    """Runs a load generator's coroutine on uvloop where it is installed, else on asyncio's
    loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)  # type: ignore[arg-type]
    return uvloop.run(main)


def spec_main(load: Callable[[Dict[str, Any]], Awaitable[Dict[str, Any]]], spec_file: str) -> None:
    """A load generator process: ``load`` on the JSON spec in ``spec_file``, its result printed
    as the last line (for ``follow``)."""
    with open(spec_file) as f:
        spec = json.load(f)
    print(json.dumps(run_loop(load(spec))), flush=True)


def follow(
    cmd: List[str],
    on_start: Optional[Callable[[], None]],
    on_end: Optional[Callable[[], None]],
    cwd: Optional[str] = None,
    timeout: float = 600,
    on_spawn: Optional[Callable[[int], None]] = None,
) -> Dict[str, Any]:
    """Runs a load generator process: ``on_spawn`` with its pid, ``on_start``/``on_end`` at
    its ``measure-start`` and ``measure-end`` lines; its last JSON line returned."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=cwd)
    if on_spawn:
        on_spawn(proc.pid)
    assert proc.stdout is not None
    final = None
    for line in proc.stdout:
        line = line.strip()
        if line == "measure-start" and on_start:
            on_start()
        elif line == "measure-end" and on_end:
            on_end()
        elif line.startswith("{"):
            final = line
    proc.wait(timeout=timeout)
    if final is None:
        raise RuntimeError(f"load generator failed (exit {proc.returncode})")
    return json.loads(final)


async def read_response(reader: asyncio.StreamReader) -> Tuple[int, bytes]:
    """Status and body of one HTTP/1.1 answer (by Content-Length, or chunked)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    chunked = False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        lname = name.strip().lower()
        if lname == b"content-length":
            length = int(value.strip())
        elif lname == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if chunked:
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                break
            parts.append(data[:-2])
        return status, b"".join(parts)
    body = await reader.readexactly(length) if length else b""
    return status, body


async def main_async(args: argparse.Namespace) -> dict:
    with open(args.requests, "rb") as f:
        requests: List[Tuple[bytes, int, int]] = pickle.load(f)  # (raw request, samples, ticks)

    loop = asyncio.get_running_loop()
    t_start = loop.time()
    t_measure = t_start + args.warmup
    t_end = t_measure + args.duration
    stats = {
        "ok": 0,
        "samples": 0,
        "ticks": 0,
        "bytes_sent": 0,
        "errors": 0,
        "status": {},
        "latencies": [],
        "warmup_ok": 0,
        # Every 200, also those outside the measured window: what the store must hold.
        "acked": 0,
    }
    error_examples: List[str] = []
    counter = [0]

    async def worker(wid: int) -> None:
        reader, writer = await asyncio.open_connection(args.host, args.port)
        n = len(requests)
        try:
            while True:
                now = loop.time()
                if now >= t_end:
                    break
                i = counter[0]
                counter[0] = i + 1
                raw, samples, ticks = requests[i % n]
                t0 = time.perf_counter()
                writer.write(raw)
                status, body = await read_response(reader)
                t1 = time.perf_counter()
                done = loop.time()
                in_window = t_measure <= done < t_end
                if status == 200:
                    stats["acked"] += 1
                    if in_window:
                        stats["ok"] += 1
                        stats["samples"] += samples
                        stats["ticks"] += ticks
                        stats["bytes_sent"] += len(raw)
                        stats["latencies"].append(t1 - t0)
                    elif done < t_measure:
                        stats["warmup_ok"] += 1
                else:
                    key = str(status)
                    stats["status"][key] = stats["status"].get(key, 0) + 1
                    if in_window:
                        stats["errors"] += 1
                    if len(error_examples) < 3:
                        error_examples.append(f"{status}: {body[:200]!r}")
        finally:
            writer.close()

    tasks = [asyncio.create_task(worker(i)) for i in range(args.concurrency)]
    tasks.append(asyncio.create_task(mark_window(loop, t_measure, t_end, stats)))
    results = await asyncio.gather(*tasks, return_exceptions=True)
    failures = [repr(r) for r in results if isinstance(r, BaseException)]
    stats.update(
        duration_s=args.duration,
        concurrency=args.concurrency,
        latency_ms=latency_pcts(stats.pop("latencies")),
        worker_failures=failures[:3],
        error_examples=error_examples,
    )
    return stats


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--requests", required=True)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--duration", type=float, default=20.0)
    args = parser.parse_args()
    print(json.dumps(run_loop(main_async(args))), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
