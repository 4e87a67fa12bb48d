"""The agent: a sampler (native, or the Python fallback), the other collectors (allocations and
heap, locks, threads and tasks: :mod:`hotspan.agent.collectors`), and a Python thread that,
whenever the sampler has finished a window (every ``upload_interval``), has its outbox
(:mod:`hotspan.agent.outbox`) turn it into one CPU and one wall pprof for the uploader, and as
often asks each collector for its profiles, for the outbox too.  With
the native sampler that thread is not on the sampling path: if a busy program keeps it from
the GIL, windows wait for it (bounded) and nothing is lost."""

from __future__ import annotations

import atexit
import importlib
import os
import sys
import threading
import time

from hotspan import __version__
from hotspan._speedups import load_sampler
from hotspan.agent import context
from hotspan.agent.collectors import alloc_exclusion
from hotspan.agent.config import (
    DEFAULT_SERVER_ADDRESS,
    AgentConfig,
    otlp_profiles_target,
    request_headers,
)
from hotspan.agent.first_wait import FirstWait
from hotspan.agent.gc_footprint import untrack_new_code
from hotspan.agent.governor import Governor, Meter, Reading
from hotspan.agent.live import LiveSettings, profile_types
from hotspan.agent.log import logger
from hotspan.agent.outbox import Outbox, pull_hub
from hotspan.agent.sampler import make_sampler
from hotspan.agent.symbols import agent_code
from hotspan.agent.uploader import Uploader, query_string
from hotspan.model.agent_settings import (
    INSTANCE_HEADER,
    STATUS_HEADER,
    SettingsError,
    validate_settings,
)

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple

    from hotspan.agent.collectors import Collector


# With the native sampler the agent's loop wakes at most this often (see _wake_interval),
# except for the first START_PIN_S of sampling, when it pins every START_WAKE_S: a program
# shorter than a second (a script under `hotspan run`) has its module's code object freed
# before the exit's collect could name it, unless pinned while it ran.
QUIET_WAKE_S = 1.0
START_WAKE_S = 0.1
START_PIN_S = 2.0

# Collector modules in hotspan.agent.collectors; each has make_collector(config), which gives
# None when its profile is turned off or cannot be taken here.
COLLECTOR_MODULES = ("alloc", "locks", "threads")


def _enable_pull() -> None:
    from hotspan.agent import pull

    pull.enable()


def _native_waker() -> Optional[Callable[[], Any]]:
    """The native ``Waker`` type, where built: threading.Event's interface, with a wait that
    takes the GIL back by a turn the main thread hands over rather than in the GIL's queue,
    where a busy asyncio loop would keep it for ever and pay a futex wake at every poll of its
    selector (see _speedups/sampler/turns.c).  The agent's threads wait on it.

    None where threads are not threads: gevent and eventlet replace ``_thread``'s
    ``start_new_thread`` (a builtin) with one that starts a greenlet on the main thread, where
    a native wait would stop every greenlet of the program for its length."""
    native = load_sampler()
    if native is None or not _real_threads():
        return None
    return native.Waker


def _real_threads() -> bool:
    """Whether threading starts OS threads: its thread starters are still ``_thread``'s
    builtins (3.13 starts them with ``start_joinable_thread``)."""
    import _thread

    starters = [getattr(_thread, n, len) for n in ("start_new_thread", "start_joinable_thread")]
    starters += [
        getattr(threading, n, len) for n in ("_start_new_thread", "_start_joinable_thread")
    ]
    return all(isinstance(f, type(len)) for f in starters)


def _waker(make: Optional[Callable[[], Any]]) -> Any:
    """What the agent's loop waits on: made by ``make`` (_native_waker's), else an Event."""
    return make() if make is not None else threading.Event()


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.live = LiveSettings(config)
        # Set, with _wake, to end the agent's loop: a flag rather than an Event, which would be
        # six more objects for the program's GC to walk (see agent/log.py).
        self._stopping = False
        self.stopped = False  # shut down: the status of the last upload says so
        # What wakes the agent's loop before its interval: a stop, a change of settings.  The
        # uploader's thread waits on the same kind.
        self._make_waker = _native_waker()
        self._wake = _waker(self._make_waker)
        self.live.on_change = self._wake.set
        self._thread: Optional[threading.Thread] = None
        self._rate = config.sample_rate  # in force: the governor lowers it under load
        self._sampler: Any = None
        self._sampler_spec: Optional[Tuple[int, bool, bool]] = None  # (rate, cpu, wall) running
        self._pin_often_until = 0.0
        self._window_ns = int(config.upload_interval * 1e9)
        self._excluded: Set[int] = set()
        self.instance_id = _instance_id()
        otlp = ""
        address, headers = config.server_address, request_headers(config)
        if config.exporter == "otlp":
            # To an OpenTelemetry Collector (or hotspan's own receiver), where the standard
            # OTEL_EXPORTER_OTLP_* variables say.
            address, otlp_headers, otlp = otlp_profiles_target()
            headers.update(otlp_headers)
        self._uploader = Uploader(
            # Pull mode only: an uploader that is never started stands in (stats, flush).
            address if config.uploads() else DEFAULT_SERVER_ADDRESS,
            headers,
            max_buffer_bytes=config.max_buffer_bytes,
            timeout=config.upload_timeout,
            user_agent=f"hotspan-agent/{__version__}",
            waker=self._make_waker,
            otlp=otlp,
        )
        # Pull mode only (server_address "none"): nothing is uploaded, the endpoints of
        # agent/pull.py are how profiles leave the process.
        self._uploading = config.uploads()
        if not self._uploading:
            _enable_pull()
        # Turns the sampler's windows and the collectors' profiles into uploads.
        self.outbox = Outbox(config, self._uploader, self._uploading)
        # A Collector has no settings to give: the agent's own configuration holds.
        if config.remote_settings and self._uploading and not otlp:
            self._uploader.follow_settings(self._status_headers, self._on_server_settings)
        self._collectors: List[Collector] = []
        self._collector_specs: Dict[str, Any] = {}  # name -> what it was started with
        self._next_collect = 0.0
        self.span_linking = False
        # Staying within budget (agent/governor.py).
        self._governor = Governor(
            config.cpu_threshold,
            config.mem_threshold,
            config.load_shedding_cpu,
            config.max_overhead,
            config.min_sample_rate,
        )
        self._meter = Meter()
        self._next_check = 0.0
        self.last_reading: Optional[Reading] = None
        self._applied_generation = -1
        self.applied_version = 0  # of the server's settings, once the loop has applied them
        self._applied = threading.Condition(threading.Lock())
        self._last_send = time.monotonic()
        self._control_server: Any = None

    # -------------------------------------------------------------- lifecycle

    def start(self) -> None:
        if self.config.trace_correlation:
            native = self.config.native and load_sampler() is not None
            self.span_linking = context.install_span_linking(
                self.config.root_spans_only,
                native=native,
                span_stats=self.config.span_stats or self.config.cpu_threshold_percent > 0,
            )
        self._start_threads()
        atexit.register(self._at_exit)
        if self.config.control_port:
            from hotspan.agent.control_server import ControlServer

            _enable_pull()  # the control port answers /debug/pprof too

            try:
                server = ControlServer(self.config.control_host, self.config.control_port)
                server.start()
                self._control_server = server
            except Exception:  # noqa: BLE001 - a port taken, no thread: never the program's
                logger.warning(
                    "hotspan: the control endpoint cannot listen on %s:%d",
                    self.config.control_host,
                    self.config.control_port,
                    exc_info=True,
                )

    def _start_threads(self) -> None:
        self._start_uploader()
        self._apply_settings()
        self._start_thread()

    def _start_uploader(self) -> None:
        """Starts the uploader's thread, which no sampler samples (a running one included)."""
        if not self._uploading:
            return
        self._uploader.start()
        ident = self._uploader.thread_ident
        if ident is not None:
            self._excluded.add(ident)
            if self._sampler_spec is not None:
                self._sampler.exclude(ident)

    def _start_sampler(self, rate: int, cpu: bool, wall: bool, after: Any = None) -> None:
        """``after``: the sampler just stopped, when this one replaces it."""
        config = self.config
        self._sampler = make_sampler(rate, config.max_depth, cpu, wall, config.native)
        try:
            self._sampler.start(self._window_ns, after=after)
        except RuntimeError:
            # The native sampler cannot run here (an unknown kernel clock encoding, no thread
            # could be started): the fallback can.
            logger.warning("hotspan: native sampler unavailable; using Python", exc_info=True)
            self._sampler = make_sampler(rate, config.max_depth, cpu, wall, native=False)
            self._sampler.start(self._window_ns)
        for ident in self._excluded:
            self._sampler.exclude(ident)
        self._pin_often_until = time.monotonic() + START_PIN_S
        self._rate = rate
        self._sampler_spec = (rate, cpu, wall)

    def _stop_sampler(self) -> Optional[Tuple[Any, int]]:
        """Stops sampling; returns what was taken, with its period, to be encoded (after a
        new sampler has started, so that the program's CPU meanwhile is not lost)."""
        if self._sampler_spec is None:
            return None
        self._sampler.stop()
        collected = self._sampler.collect(final=True)
        self._sampler_spec = None
        return collected, 1_000_000_000 // self._rate

    def _start_collectors(self, specs: Dict[str, Any]) -> None:
        """Starts the named collectors: alloc with its bytes per sample, the others with
        True.  One that cannot run here is left out, with a warning."""
        self._next_collect = time.monotonic() + self.config.upload_interval
        config = self.config
        if "alloc" in specs:
            config = _replace(config, alloc_sample_bytes=specs["alloc"])
        for name in COLLECTOR_MODULES:
            if name not in specs:
                continue
            try:
                module = importlib.import_module(f"hotspan.agent.collectors.{name}")
            except ImportError:  # a build without that collector
                logger.debug("hotspan: no %s collector", name, exc_info=True)
                continue
            try:
                collector = module.make_collector(config)
                if collector is not None:
                    collector.start()
                    self._collectors.append(collector)
                    self._collector_specs[name] = specs[name]
            except Exception:  # noqa: BLE001 - one profile missing must not stop the others
                logger.warning("hotspan: the %s profile is unavailable", name, exc_info=True)

    def _start_thread(self) -> None:
        self._stopping = False
        first_wait = FirstWait()
        self._thread = threading.Thread(
            target=self._run,
            args=(first_wait, alloc_exclusion()),
            name="hotspan-sampler",
            daemon=True,
        )
        self._thread.start()
        first_wait.wait()

    def shutdown(self, flush: bool = True) -> None:
        try:
            atexit.unregister(self._at_exit)
            if self._control_server is not None:
                self._control_server.stop()
            # The last upload says so: the server shows the instance as stopped, not as one
            # that profiles at no rate.
            self.stopped = True
            self._stopping = True
            self._wake.set()
            thread = self._thread
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=2.0)
            if self._sampler_spec is not None:
                self._sampler.stop()
            self._stop_collectors(flush)
            if flush:
                # With what still waits for its spans: at exit, nothing more will end.
                self.outbox.send_profiles([], self._rate, final=True)
                if self._sampler_spec is not None:
                    self.outbox.upload(self._sampler, self._rate, final=True)
                else:
                    self.outbox.upload_held(self._rate, final=True)
            self._sampler_spec = None
            if self.outbox.conditions is not None:
                self.outbox.conditions.uninstall()
            if flush:
                self._uploader.flush(self.config.exit_flush_timeout)
            self._uploader.stop(timeout=1.0)
            stats = self._uploader.stats
            if stats.dropped_uploads or self.dropped_samples:
                logger.info(
                    "hotspan: dropped %d uploads (%d bytes) and %d samples",
                    stats.dropped_uploads,
                    stats.dropped_bytes,
                    self.dropped_samples,
                )
        except Exception:  # noqa: BLE001 - never raise into the program
            logger.warning("hotspan: shutdown failed", exc_info=True)

    def _stop_collectors(self, flush: bool, names: Optional[Set[str]] = None) -> None:
        keep: List[Collector] = []
        for collector in self._collectors:
            if names is not None and collector.name not in names:
                keep.append(collector)
                continue
            self._collector_specs.pop(collector.name, None)
            try:
                if flush:
                    self.outbox.send_profiles(collector.collect(final=True), self._rate)
                collector.stop()
            except Exception:  # noqa: BLE001
                logger.warning(
                    "hotspan: stopping the %s profile failed", collector.name, exc_info=True
                )
        self._collectors = keep

    def _at_exit(self) -> None:
        self.shutdown(flush=True)

    def after_fork_in_child(self) -> None:
        """A forked worker profiles itself: its own sampler and uploader thread, nothing of
        the parent's pending data (the parent sends that)."""
        try:
            running = self._thread is not None and not self._stopping
            self.outbox.after_fork()
            self._applied = threading.Condition(threading.Lock())
            self._wake = _waker(self._make_waker)
            self.live.on_change = self._wake.set
            self._excluded = set()
            self._control_server = None  # the parent's; a worker has none of its own
            self._meter = Meter()  # the parent's threads and clocks are not this process's
            self.live.reset_after_fork()
            hub = pull_hub()
            if hub is not None:
                hub.after_fork()
            self.instance_id = _instance_id()
            if self._sampler is not None:
                self._sampler.after_fork()
            for collector in self._collectors:
                collector.after_fork()
            self._uploader.reset_after_fork()
            if not running:
                self._stopping = True
                return
            # The same sampler and collectors go on in the child: started again, not anew.
            if self._sampler_spec is not None:
                self._sampler.start(self._window_ns)
            self._start_uploader()
            self._start_thread()
            _flush_at_multiprocessing_exit(self)
        except Exception:  # noqa: BLE001
            logger.debug("hotspan: restart after fork failed", exc_info=True)

    # -------------------------------------------------------------- live settings

    def _apply_settings(self) -> None:
        """Makes the sampler and collectors what the settings and the governor ask for.
        Only the agent's loop calls it (and start, before the loop runs)."""
        settings, version, generation = self.live.snapshot()
        self._governor.max_overhead = float(settings["max_overhead"])
        self._update_conditions(settings)
        types = set(profile_types(settings))
        active = bool(settings["enabled"]) and not self.shedding
        wanted = self.wanted_rate(settings)
        rate = self._governor.rate_for(wanted)
        sampler_spec: Optional[Tuple[int, bool, bool]] = (rate, "cpu" in types, "wall" in types)
        if not active:
            # Even with neither CPU nor wall wanted the sampler runs: it is what makes span
            # labels readable for the collectors (enable_native_labels), at no sampling cost.
            sampler_spec = None
        if sampler_spec != self._sampler_spec:
            # A new rate or new kinds: the next sampler takes up where this one stops.
            replaced = self._sampler if self._sampler_spec is not None else None
            taken = self._stop_sampler()
            if sampler_spec is not None:
                self._start_sampler(*sampler_spec, after=replaced)
            if taken is not None:
                self.outbox.upload(self._sampler, self._rate, final=False, taken=taken)
        specs: Dict[str, Any] = {}
        if active:
            if "alloc" in types:
                specs["alloc"] = int(settings["alloc_sample_bytes"])
            for name in ("locks", "threads"):
                if name in types:
                    specs[name] = True
        changed = {n for n in COLLECTOR_MODULES if specs.get(n) != self._collector_specs.get(n)}
        if changed:
            self._stop_collectors(flush=True, names=changed)
            self._start_collectors({n: specs[n] for n in changed if n in specs})
        with self._applied:
            self._applied_generation = generation
            self.applied_version = version
            self._applied.notify_all()

    def _update_conditions(self, settings: Dict[str, Any]) -> None:
        config = self.config
        slow = float(settings["slow_request_threshold"])
        outbox = self.outbox
        outbox.conditional_only = bool(settings["conditional_only"]) and self.span_linking
        wanted = self.span_linking and (
            slow > 0 or config.error_condition or config.cpu_threshold_percent > 0
        )
        if wanted and outbox.conditions is None:
            from hotspan.agent.spans import SpanConditions

            outbox.conditions = SpanConditions(
                slow, config.error_condition, config.cpu_threshold_percent
            )
            outbox.conditions.install()
        if outbox.conditions is not None:
            outbox.conditions.set_slow_threshold(slow)

    def wanted_rate(self, settings: Optional[Dict[str, Any]] = None) -> int:
        """The rate asked for, before the governor has its say."""
        settings = settings if settings is not None else self.live.effective()
        if settings.get("conditional_only") and self.config.conditional_sample_rate:
            return int(self.config.conditional_sample_rate)
        return int(settings["sample_rate"])

    def wait_applied(self, timeout: float = 2.0) -> bool:
        """Waits until the loop has applied the latest change (the control endpoint's answer
        then shows its effect)."""
        deadline = time.monotonic() + timeout
        with self._applied:
            while self._applied_generation < self.live.generation:
                left = deadline - time.monotonic()
                if left <= 0 or self._stopping:
                    return False
                self._applied.wait(min(left, 0.1))
        return True

    def _check_resources(self) -> None:
        reading = self._meter.read()
        if reading is None:
            return
        self.last_reading = reading
        settings = self.live.effective()
        if not settings["enabled"]:
            if self.shedding:
                self._governor.stop_shedding()
                self._uploader.pause(False)
            return
        was_shedding = self.shedding
        rate, shed = self._governor.decide(self.wanted_rate(settings), reading)
        if shed != was_shedding:
            if shed:
                logger.info("hotspan: load shedding (%s); profiling paused", reading)
            else:
                logger.info("hotspan: load fell (%s); profiling resumes", reading)
            self._uploader.pause(shed)
            self._apply_settings()
        elif self._sampler_spec is not None and rate != self._sampler_spec[0]:
            logger.info("hotspan: sample rate %d Hz (%s, %s)", rate, self._governor.reason, reading)
            self._apply_settings()

    @property
    def shedding(self) -> bool:
        return bool(self._governor.shedding)

    # -------------------------------------------------------------- sampling loop

    def _wake_interval(self) -> float:
        """How long the loop sleeps: the Python sampler ticks from here at its rate; with the
        native one there is nothing to do between windows but pin the code objects sampled
        (so short-lived code keeps its name), so the loop wakes rarely, and a busy program
        does not hand it the GIL ten times a second for nothing."""
        sampler = self._sampler
        if self._sampler_spec is not None and sampler.name == "python":
            return float(sampler.tick_interval)
        if time.monotonic() < self._pin_often_until:
            return START_WAKE_S
        return min(QUIET_WAKE_S, max(self.config.upload_interval / 2, 0.05))

    def _run(self, first_wait: FirstWait, leave_alloc_profile: Callable[[], None]) -> None:
        # First: every allocation after it is the agent's (its thread ident, a large int,
        # is one), and none may be sampled as the program's.
        leave_alloc_profile()
        self._excluded.add(threading.get_ident())
        if self._sampler_spec is not None:
            self._sampler.exclude(threading.get_ident())
        check_every = self.config.resource_check_interval
        self._next_check = time.monotonic() + check_every
        wake = self._wake
        first_wait.reached()
        while True:
            # A settings change (the control endpoint, the server's answer) or shutdown wakes
            # the loop at once; nothing else needs it before its interval.
            wake.wait(self._wake_interval())
            wake.clear()  # before the stop is read: a stop after it wakes the next wait
            if self._stopping:
                return
            try:
                now = time.monotonic()
                if now >= self._next_check:
                    self._check_resources()
                    # From the end of the check: beside a busy program it can take seconds
                    # (the GIL), and the next reading needs a whole interval to mean anything.
                    self._next_check = time.monotonic() + check_every
                if self.live.generation != self._applied_generation:
                    self._apply_settings()
                if self._sampler_spec is not None:
                    self._sampler.tick()
                    self.outbox.upload(self._sampler, self._rate, final=False)
                elif self.outbox.holds_windows:
                    self.outbox.upload_held(self._rate, final=False)
                for collector in self._collectors:
                    look = getattr(collector, "look", None)
                    if look is not None:
                        look()
                if self._collectors and time.monotonic() >= self._next_collect:
                    self._next_collect = time.monotonic() + self.config.upload_interval
                    self.outbox.collect(self._collectors, self._rate)
                    hub = pull_hub()
                    if hub is not None:
                        hub.collected()
                self._poll_if_quiet()
                if self.config.native:
                    untrack_new_code()
            except Exception:  # noqa: BLE001 - a bug here must not stop the program
                logger.warning("hotspan: sampling failed; profiling stops", exc_info=True)
                return

    def _poll_if_quiet(self) -> None:
        """An agent that uploads nothing (disabled, shedding, idle) asks the server for its
        settings once an upload interval, so it can be turned back on."""
        if not self.config.remote_settings or not self._uploading:
            return
        now = time.monotonic()
        if now - self._last_send >= self.config.upload_interval:
            self._last_send = now
            # Not a whole interval: the last poll went a little after its check did.
            if self._uploader.idle_for(0.9 * self.config.upload_interval):
                self._uploader.poll(
                    f"/api/v1/agent/settings?{query_string({'name': self.outbox.app_name()})}"
                )

    # -------------------------------------------------------------- talking to the server

    def _status_headers(self) -> Dict[str, str]:
        import json

        return {
            INSTANCE_HEADER: self.instance_id,
            STATUS_HEADER: json.dumps(self.status(), separators=(",", ":")),
        }

    def _on_server_settings(self, answer: Any) -> None:
        """The JSON the server answered an upload or poll with (uploader thread)."""
        if not isinstance(answer, dict):
            return
        version = answer.get("version")
        settings = answer.get("settings")
        if not isinstance(version, int) or isinstance(version, bool):
            return
        try:
            checked = validate_settings(settings) if settings is not None else None
        except SettingsError as exc:
            logger.warning("hotspan: the server's settings were not applied: %s", exc)
            return
        if self.live.set_remote(version, checked):
            logger.info("hotspan: server settings version %d: %s", version, checked)

    def remove_tags(self, tags: Mapping[str, str]) -> None:
        """Take these ``key=value`` tags off the profiles from the next upload on (a key whose
        value differs, the user's own, stays)."""
        kept = {k: v for k, v in self.config.tags.items() if tags.get(k) != v}
        # One assignment: the uploader's thread reads the dict whole, old or new.
        self.config.tags = kept

    def status(self) -> Dict[str, Any]:
        """What the agent does now: the control endpoint's GET, and each upload's report."""
        settings = self.live.effective()
        stats = self._uploader.stats
        reading = self.last_reading
        reason = "disabled" if not settings["enabled"] else self._governor.reason
        running = self._sampler_spec
        return {
            "enabled": bool(settings["enabled"]),
            "profiling": running is not None or bool(self._collectors),
            "stopped": self.stopped,
            "sample_rate": running[0] if running is not None else 0,
            "configured_rate": self.wanted_rate(settings),
            "profile_types": profile_types(settings),
            "alloc_sample_bytes": settings["alloc_sample_bytes"],
            "conditional_only": bool(settings["conditional_only"]),
            "slow_request_threshold": settings["slow_request_threshold"],
            "max_overhead": float(settings["max_overhead"]),
            "overhead": round(reading.overhead_percent, 4) if reading else 0.0,
            "cpu_percent": round(reading.cpu_percent, 2) if reading else 0.0,
            "mem_percent": round(reading.mem_percent, 2) if reading else 0.0,
            "shedding": self.shedding,
            "shed_seconds": round(self._governor.shed_seconds(), 3),
            "rate_reason": reason,
            # Over budget, but a lower rate did not lower the agent's share (see governor.py).
            "budget_futile": self._governor.futile,
            "dropped_samples": self.dropped_samples,
            "dropped_uploads": stats.dropped_uploads,
            "settings_version": self.applied_version,
            "local_overrides": sorted(self.live.local),
            "sampler": self.sampler_name,
            "hostname": _hostname(),
            "pid": os.getpid(),
            "version": __version__,
        }

    def collect_soon(self) -> None:
        """The collectors' next round now rather than in up to an upload interval (a pull of
        heap, allocs or mutex waits for it)."""
        self._next_collect = 0.0

    @property
    def sampler_name(self) -> str:
        if self._sampler is None:  # disabled since the start: the one it would use
            native = self.config.native and load_sampler() is not None
            return "native" if native else "python"
        return str(self._sampler.name)

    @property
    def upload_stats(self) -> Any:
        return self._uploader.stats

    @property
    def dropped_samples(self) -> int:
        """Samples taken but not kept: the sampler's ring or memory bound."""
        return self.outbox.dropped_samples

    @property
    def sampler_stats(self) -> Dict[str, int]:
        """The sampler's own counts: threads sampled, samples lost, windows dropped."""
        stats = self._sampler.stats() if self._sampler is not None else {}
        return {**stats, "dropped_samples": self.dropped_samples}

    @property
    def collectors(self) -> Dict[str, str]:
        """The collectors running besides the sampler: name -> "native" or "python"."""
        return {c.name: c.implementation for c in self._collectors}

    def collector_stats(self) -> Dict[str, Dict[str, int]]:
        return {c.name: dict(c.stats()) for c in self._collectors}


def _replace(config: AgentConfig, **changes: Any) -> AgentConfig:
    from hotspan.agent.config import SETTINGS

    values = {name: getattr(config, name) for name in SETTINGS}
    values.update(changes)
    return AgentConfig(**values)


def _hostname() -> str:
    return os.uname().nodename  # socket.gethostname(), without importing socket


def _instance_id() -> str:
    """Tells this process apart from the service's others, and from a restart of itself."""
    return f"{_hostname()}/{os.getpid()}/{os.urandom(2).hex()}"


def _flush_at_multiprocessing_exit(agent: Agent) -> None:
    """A forked multiprocessing worker ends with os._exit, which skips atexit: it runs its
    finalizers first, and one of them sends what the worker profiled.  Registered through
    register_after_fork because the worker clears the finalizers it inherited (and those made
    in os.fork's hooks) as it starts; a plain os.fork child never runs it."""
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is None:
        return

    def at_worker_exit() -> None:
        agent._at_exit()

    def in_worker(_: object) -> None:
        mp_util.Finalize(None, at_worker_exit, exitpriority=-100)

    mp_util.register_after_fork(agent, in_worker)


# The agent's start and stop run on the program's thread (configure, shutdown, the atexit
# handler, with a join of up to 2 s): hotspan's work, one ``hotspan`` frame in any sample
# taken meanwhile, not the program's.
for _method in (Agent.start, Agent.shutdown, Agent._at_exit):
    agent_code(_method.__code__)
del _method
