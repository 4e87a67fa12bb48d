"""Pull mode on the server: ``hotspan server --scrape FILE`` reads Go's ``/debug/pprof``
endpoints of the targets FILE lists (a Go program with ``net/http/pprof``, a Python program
with :mod:`hotspan.debug_pprof`) and stores what it pulls as a pprof push.

The file's format: server.scrape_config.

What is stored, per target, with the labels ``service_name``, ``job``, ``instance`` (the
target) and the configuration's:

- cpu: ``profile?seconds=<interval - 1>`` back to back, as Alloy does: every second counted;
- heap (its inuse_* sample types) and goroutine: gauges, stored as scraped;
- allocs (its alloc_* sample types), mutex and block: cumulative since the target started, so
  what is stored is the difference between two scrapes (Alloy's ``delta``), and a range sums
  to what happened in it.  The first scrape of a target is the baseline; a counter that went
  down (the target restarted) starts the count again.

A target that is down is logged once per change of state, counted and tried again at the next
interval; it never stops the other targets or the server.  ``GET /api/v1/scrape/targets``
shows each target's state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hotspan import __version__

if TYPE_CHECKING:
    # Imported where a scrape runs: every server serves this module's routes, few scrape, and
    # httpx with its command-line extras costs each server start ~70 ms.
    import httpx
from hotspan.model.profile import IngestBatch
from hotspan.server import ingestion
from hotspan.server.errors import HTTPError, bare_errors
from hotspan.server.request import tenant_of
from hotspan.server.scrape_config import PROFILES, ScrapeConfig, Target

log = logging.getLogger(__name__)

# Sample types each stored profile keeps (heap's alloc_* are the allocs profile's business).
KEEP_TYPES = {"heap": ("inuse_objects", "inuse_space"), "allocs": ("alloc_objects", "alloc_space")}


# ---------------------------------------------------------------- fetching


class FetchError(Exception):
    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


async def http_get(
    client: httpx.AsyncClient, url: str, timeout: float, limit: int, headers: Mapping[str, str]
) -> bytes:
    """The body of a 200 answer to GET ``url`` within ``timeout`` seconds in all, at most
    ``limit`` bytes, else FetchError."""
    import httpx

    try:
        return await asyncio.wait_for(_get(client, url, limit, headers), timeout)
    except asyncio.TimeoutError:
        raise FetchError(f"no whole answer within {timeout:g} s") from None
    except httpx.ConnectError as exc:
        raise FetchError(f"cannot connect: {exc}") from None
    except httpx.HTTPError as exc:
        raise FetchError(f"connection failed: {exc or type(exc).__name__}") from None


async def _get(
    client: httpx.AsyncClient, url: str, limit: int, headers: Mapping[str, str]
) -> bytes:
    async with client.stream("GET", url, headers=headers) as response:
        body = bytearray()
        async for chunk in response.aiter_raw():
            body += chunk
            if len(body) > limit:
                raise FetchError(f"answer over {limit} bytes")
        if response.status_code != 200:
            reason = bytes(body[:200]).decode("utf-8", "replace").strip()
            status = response.status_code
            raise FetchError(f"HTTP {status}" + (f": {reason}" if reason else ""), status)
        return bytes(body)


# ---------------------------------------------------------------- scraping


@dataclass
class TargetState:
    target: Target
    profile: str
    health: str = "unknown"  # up, down, not_served (a default profile the target 404s)
    last_scrape: float = 0.0  # unix seconds
    last_duration_s: float = 0.0
    last_error: str = ""
    scrapes: int = 0
    failures: int = 0
    previous: Any = field(default=None, repr=False)  # the last cumulative profile (delta)

    def as_json(self) -> Dict[str, Any]:
        t = self.target
        return {
            "job": t.job,
            "instance": t.instance,
            "profile": self.profile,
            "url": t.url(self.profile),
            "labels": dict(t.labels),
            "health": self.health,
            "last_scrape": self.last_scrape,
            "last_duration_s": round(self.last_duration_s, 3),
            "last_error": self.last_error,
            "interval_s": t.interval_s,
            "scrapes": self.scrapes,
            "failures": self.failures,
        }


class Scraper:
    """One task per (target, profile) on the server's event loop."""

    def __init__(self, state: Any, config: ScrapeConfig) -> None:
        self.state = state
        self.config = config
        self.targets = [TargetState(t, p) for t in config.targets for p in t.profiles]
        self._tasks: List[asyncio.Task] = []
        self._unreachable: set = set()  # (job, instance) logged as not reachable
        import httpx

        # One connection pool for all targets; timeouts are per scrape (http_get).
        self._client = httpx.AsyncClient(
            timeout=None, headers={"User-Agent": f"hotspan-scraper/{__version__}"}
        )

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for target in self.targets:
            self._tasks.append(loop.create_task(self._run(target)))
        log.info("scraping %d targets from %s", len(self.config.targets), self.config.path)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._client.aclose()

    async def _run(self, ts: TargetState) -> None:
        loop = asyncio.get_running_loop()
        interval = ts.target.interval_s
        next_at = loop.time()
        while True:
            try:
                await self.scrape_once(ts)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - one target's bug must not stop the others
                t = ts.target
                log.exception("scrape %s %s %s failed", t.job, t.instance, ts.profile)
            next_at += interval
            now = loop.time()
            if next_at < now:  # a scrape that took longer than the interval: no catching up
                next_at = now
            await asyncio.sleep(next_at - now)

    def cpu_seconds(self, target: Target) -> int:
        # As Alloy: the interval less a second, so that each scrape is done before the next.
        return max(1, int(target.interval_s) - 1)

    async def scrape_once(self, ts: TargetState) -> None:
        target = ts.target
        seconds = self.cpu_seconds(target) if ts.profile == "cpu" else 0
        url = target.url(ts.profile, seconds)
        headers = {"Authorization": f"Bearer {target.bearer_token}"} if target.bearer_token else {}
        started = time.monotonic()
        ts.last_scrape = time.time()
        ts.scrapes += 1
        limit = self.state.config.max_body_bytes
        try:
            body = await http_get(self._client, url, seconds + target.timeout_s, limit, headers)
            await self._store(ts, body)
        except (FetchError, ValueError, HTTPError) as exc:
            # (HTTPError: the store refused it, or a label past its limit.)
            ts.last_duration_s = time.monotonic() - started
            if isinstance(exc, FetchError) and exc.status == 404 and not target.explicit:
                self._set_health(ts, "not_served", str(exc))
                return
            ts.failures += 1
            self._set_health(ts, "down", str(exc))
            return
        ts.last_duration_s = time.monotonic() - started
        self._set_health(ts, "up", "")

    def _set_health(self, ts: TargetState, health: str, error: str) -> None:
        ts.last_error = error
        if health == ts.health:
            return
        was, ts.health = ts.health, health
        t = ts.target
        # A target that cannot be reached is one line, not one per profile.
        unreachable = error.startswith("cannot connect")
        key = (t.job, t.instance)
        if unreachable and key in self._unreachable:
            return
        if unreachable:
            self._unreachable.add(key)
        elif health == "up" and key in self._unreachable:
            self._unreachable.discard(key)
            log.warning("scrape %s %s: reachable again", t.job, t.instance)
            return
        if health == "down":
            log.warning("scrape %s %s %s: down: %s", t.job, t.instance, ts.profile, error)
        elif health == "not_served":
            log.info("scrape %s %s %s: not served (%s)", t.job, t.instance, ts.profile, error)
        elif was == "down":
            log.warning("scrape %s %s %s: up again", t.job, t.instance, ts.profile)

    async def _store(self, ts: TargetState, body: bytes) -> None:
        kind = PROFILES[ts.profile][1]
        now = time.time_ns()
        if kind != "as_is":
            transformed = self._transform(ts, body, kind, now)
            if transformed is None:
                return  # a baseline: nothing happened yet that we could tell
            body = transformed
        state = self.state
        batch = IngestBatch()
        # The same path as a pprof pushed to /ingest: decode, label, redact, store.
        ingestion.pprof_to_batch(
            body, state.config.max_decompressed_bytes, batch, dict(ts.target.labels), now
        )
        await ingestion.commit(state, ts.target.tenant or state.config.default_tenant, batch)

    def _transform(self, ts: TargetState, body: bytes, kind: str, now: int) -> Optional[bytes]:
        from hotspan.formats.pprof import read_stack_profile, write_stack_profile

        limit = self.state.config.max_decompressed_bytes
        profile = _keep(read_stack_profile(body, limit), KEEP_TYPES.get(ts.profile))
        if not profile.sample_types:
            raise ValueError(f"the {ts.profile} profile has none of the expected sample types")
        if kind == "gauge":
            profile.time_ns = now
            return write_stack_profile(profile, compress=False)
        previous, ts.previous = ts.previous, (profile, now)
        if previous is None or previous[0].sample_types != profile.sample_types:
            return None
        delta = _delta(profile, previous[0])
        delta.time_ns = previous[1]
        delta.duration_ns = now - previous[1]
        if not delta.stacks:
            return None
        return write_stack_profile(delta, compress=False)

    def snapshot(self, tenant: str) -> List[Dict[str, Any]]:
        """The targets whose profiles go to ``tenant``, with their last scrape."""
        default = self.state.config.default_tenant
        return [ts.as_json() for ts in self.targets if (ts.target.tenant or default) == tenant]


def _keep(profile: Any, names: Optional[Tuple[str, ...]]) -> Any:
    """``profile`` with only the sample types ``names`` (all when None)."""
    if names is None:
        return profile
    return profile.subset([i for i, st in enumerate(profile.sample_types) if st.type in names])


def _delta(current: Any, previous: Any) -> Any:
    """What ``current`` (cumulative) counted since ``previous``, per stack.  A stack whose
    count went down was reset (the target restarted): its whole count is new."""
    from hotspan.model.stack_profile import StackProfile

    out = StackProfile(
        list(current.sample_types), period_type=current.period_type, period=current.period
    )
    for stack, values in current.stacks.items():
        old = previous.stacks.get(stack)
        if old is None or any(v < o for v, o in zip(values, old)):
            diff = list(values)
        else:
            diff = [v - o for v, o in zip(values, old)]
        if any(diff):
            out.stacks[stack] = diff
    return out


# ---------------------------------------------------------------- API


@bare_errors
async def targets(request: Request) -> Response:
    """``GET /api/v1/scrape/targets``: each (target, profile) of the caller's tenant with its
    last scrape."""
    state = request.app.state.hotspan
    tenant = tenant_of(request, state.config)
    scraper: Optional[Scraper] = getattr(request.app.state, "scraper", None)
    return JSONResponse({"targets": scraper.snapshot(tenant) if scraper is not None else []})


routes = [Route("/api/v1/scrape/targets", targets, methods=["GET"])]
