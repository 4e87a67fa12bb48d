"""The agent: a sampler (native, or the Python fallback), the other collectors (allocations and
heap, locks, threads and tasks: :mod:`hotspan.agent.collectors`), and a Python thread that,
whenever the sampler has finished a window (every ``upload_interval``), turns it into one CPU
and one wall pprof for the uploader, and as often asks each collector for its profiles.  With
the native sampler that thread is not on the sampling path: if a busy program keeps it from
the GIL, windows wait for it (bounded) and nothing is lost."""

from __future__ import annotations

import atexit
import importlib
import os
import threading
import time

from hotspan import __version__
from hotspan.agent import context
from hotspan.agent.collectors.alloc import exclude_current_thread as exclude_from_alloc_profile
from hotspan.agent.config import NAME_SYNTAX_CHARS, AgentConfig, request_headers
from hotspan.agent.log import logger
from hotspan.agent.pprof_writer import ProfileWriter
from hotspan.agent.sampler import CPU, WALL, PythonSampler, Window, make_sampler
from hotspan.agent.symbols import Symbolizer
from hotspan.agent.uploader import Uploader

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Dict, List, Optional, Tuple

    from hotspan.agent.collectors import Collector, ProfileData
    from hotspan.agent.symbols import FrameInfo


CPU_TYPE = ("cpu", "nanoseconds")
WALL_TYPE = ("wall", "nanoseconds")

# Collector modules in hotspan.agent.collectors; each has make_collector(config), which gives
# None when its profile is turned off or cannot be taken here.
COLLECTOR_MODULES = ("alloc", "locks", "threads")


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._sampler = make_sampler(
            config.sample_rate, config.max_depth, config.cpu, config.wall, config.native
        )
        self._symbols = Symbolizer()
        self._label_cache: Dict[Tuple[Any, ...], Tuple[Tuple[str, str], ...]] = {}
        self._uploader = Uploader(
            config.server_address,
            request_headers(config),
            max_buffer_bytes=config.max_buffer_bytes,
            timeout=config.upload_timeout,
            user_agent=f"hotspan-agent/{__version__}",
        )
        self._collectors: List[Collector] = []
        self._next_collect = 0.0
        self._lock = threading.Lock()
        self.span_linking = False
        self.dropped_samples = 0  # taken but not kept: the sampler's ring or memory bound

    # -------------------------------------------------------------- lifecycle

    def start(self) -> None:
        if self.config.trace_correlation:
            self.span_linking = context.install_span_linking(
                self.config.root_spans_only,
                native=self._sampler.name == "native",
                span_stats=self.config.span_stats,
            )
        self._start_threads()
        atexit.register(self._at_exit)
        _register_fork_handler()

    def _start_threads(self) -> None:
        window_ns = int(self.config.upload_interval * 1e9)
        try:
            self._sampler.start(window_ns)
        except RuntimeError:
            # The native sampler cannot run here (an unknown kernel clock encoding, no thread
            # could be started): the fallback can.
            logger.warning("hotspan: native sampler unavailable; using Python", exc_info=True)
            config = self.config
            self._sampler = PythonSampler(
                config.sample_rate, config.max_depth, config.cpu, config.wall
            )
            self._sampler.start(window_ns)
        self._start_collectors()
        self._uploader.start()
        ident = self._uploader.thread_ident
        if ident is not None:
            self._sampler.exclude(ident)
        self._start_thread()

    def _start_collectors(self) -> None:
        self._next_collect = time.monotonic() + self.config.upload_interval
        if self._collectors:  # after a fork: the same collectors go on in the child
            return
        for name in COLLECTOR_MODULES:
            try:
                module = importlib.import_module(f"hotspan.agent.collectors.{name}")
            except ImportError:  # a build without that collector
                logger.debug("hotspan: no %s collector", name, exc_info=True)
                continue
            try:
                collector = module.make_collector(self.config)
                if collector is not None:
                    collector.start()
                    self._collectors.append(collector)
            except Exception:  # noqa: BLE001 - one profile missing must not stop the others
                logger.warning("hotspan: the %s profile is unavailable", name, exc_info=True)

    def _start_thread(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="hotspan-sampler", daemon=True)
        self._thread.start()

    def shutdown(self, flush: bool = True) -> None:
        try:
            atexit.unregister(self._at_exit)
            self._stop.set()
            thread = self._thread
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=2.0)
            self._sampler.stop()
            self._stop_collectors(flush)
            if flush:
                self._upload(final=True)
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

    def _stop_collectors(self, flush: bool) -> None:
        collectors, self._collectors = self._collectors, []
        for collector in collectors:
            try:
                if flush:
                    self._send_profiles(collector.collect(final=True))
                collector.stop()
            except Exception:  # noqa: BLE001
                logger.warning(
                    "hotspan: stopping the %s profile failed", collector.name, exc_info=True
                )

    def _at_exit(self) -> None:
        self.shutdown(flush=True)

    def after_fork_in_child(self) -> None:
        """A forked worker profiles itself: its own sampler and uploader thread, nothing of
        the parent's pending data (the parent sends that)."""
        try:
            running = self._thread is not None and not self._stop.is_set()
            # The parent's threads are gone, and any lock one of them held (a window being
            # encoded as the fork happened) would stay held here forever.
            self._lock = threading.Lock()
            self._stop = threading.Event()
            self._sampler.after_fork()
            for collector in self._collectors:
                collector.after_fork()
            self._uploader.reset_after_fork()
            if not running:
                self._stop.set()
                return
            self._start_threads()
        except Exception:  # noqa: BLE001
            logger.debug("hotspan: restart after fork failed", exc_info=True)

    # -------------------------------------------------------------- sampling loop

    def _run(self) -> None:
        self._sampler.exclude(threading.get_ident())
        exclude_from_alloc_profile()
        interval = self._sampler.tick_interval
        while not self._stop.wait(interval):
            try:
                self._sampler.tick()
                self._upload(final=False)
                if self._collectors and time.monotonic() >= self._next_collect:
                    self._next_collect = time.monotonic() + self.config.upload_interval
                    self._collect_profiles()
            except Exception:  # noqa: BLE001 - a bug here must not stop the program
                logger.warning("hotspan: sampling failed; profiling stops", exc_info=True)
                return

    def _collect_profiles(self) -> None:
        try:
            self._send_collected()
        finally:
            self._label_cache = {}  # the upload is done: next time, fresh thread names

    def _send_collected(self) -> None:
        for collector in list(self._collectors):
            try:
                profiles = collector.collect(final=False)
            except Exception:  # noqa: BLE001 - that profile stops, the others go on
                logger.warning(
                    "hotspan: the %s profile failed; it stops", collector.name, exc_info=True
                )
                self._collectors.remove(collector)
                collector.stop()
                continue
            self._send_profiles(profiles)

    # -------------------------------------------------------------- uploads

    def _upload(self, final: bool) -> None:
        """Encodes and queues the windows the sampler has finished (with ``final``, the one
        in progress too)."""
        with self._lock:
            collected = self._sampler.collect(final=final)
            self.dropped_samples += collected.lost
            period = 1_000_000_000 // self.config.sample_rate
            if collected.windows:
                self._label_cache = {}  # a new upload: thread names as they are now
            batches = [(w, self._encode(w, period)) for w in collected.windows]
            del collected
        for window, bodies in batches:
            params = self._params(window.start_ns, window.end_ns)
            for body in bodies:
                self._uploader.submit(params, body)

    def _params(self, start_ns: int, end_ns: int) -> Dict[str, str]:
        start_s = start_ns // 1_000_000_000
        return {
            "name": self._app_name(),
            "from": str(start_s),
            "until": str(max(end_ns // 1_000_000_000, start_s + 1)),
            "format": "pprof",
            "sampleRate": str(self.config.sample_rate),
            "spyName": "hotspan",
        }

    def _send_profiles(self, profiles: List[ProfileData]) -> None:
        """Encodes a collector's profiles and queues them for upload."""
        for profile in profiles:
            if not profile.samples:
                continue
            writer = ProfileWriter(profile.sample_types, profile.period_type, profile.period)
            names = _thread_names() if self.config.thread_name_label else {}
            labels_cache = self._label_sets()
            # One stack stands in many samples (one per span that allocated there, say): it
            # is named once.  By id: the collector hands the same tuple for the same stack,
            # and hashing a stack of code objects costs more than naming it (see Symbolizer).
            named_cache: Dict[int, Tuple[FrameInfo, ...]] = {}
            for sample in profile.samples:
                key = (sample.labels, sample.thread_ident if names else 0)
                labels = labels_cache.get(key)
                if labels is None:
                    labels = self._labels(sample.labels, names.get(sample.thread_ident))
                    labels_cache[key] = labels
                named = named_cache.get(id(sample.stack))
                if named is None:
                    named = named_cache[id(sample.stack)] = self._named(sample.stack)
                writer.add(named, sample.values, labels, stack_key=id(named))
            if len(writer):
                duration = max(profile.end_ns - profile.start_ns, 0)
                body = writer.encode(profile.start_ns, duration)
                self._uploader.submit(self._params(profile.start_ns, profile.end_ns), body)

    def _label_sets(self) -> Dict[Tuple[Any, ...], Tuple[Tuple[str, str], ...]]:
        """Label tuples by (raw labels, thread), shared by the CPU, wall and collectors'
        profiles of an upload: a span's samples are in each.  Started afresh as it grows past
        one upload's worth (thread names change, idents are reused)."""
        if len(self._label_cache) > 50_000:
            self._label_cache = {}
        return self._label_cache

    def _named(self, stack: Any) -> Tuple[FrameInfo, ...]:
        return self._symbols.name_stack(stack)

    def _encode(self, window: Window, period: int) -> List[bytes]:
        writers = {
            CPU: ProfileWriter(CPU_TYPE, CPU_TYPE, period),
            WALL: ProfileWriter(WALL_TYPE, WALL_TYPE, period),
        }
        names = _thread_names() if self.config.thread_name_label else {}
        labels_cache = self._label_sets()
        # A stack has CPU and wall samples, and one per span seen there: named once (by id,
        # as in _send_profiles; window.samples keeps the stacks alive meanwhile).
        named_cache: Dict[int, Tuple[FrameInfo, ...]] = {}
        for sample in window.samples:
            writer = writers.get(sample.kind)
            if writer is None:
                continue
            stack = named_cache.get(id(sample.stack))
            if stack is None:
                stack = named_cache[id(sample.stack)] = self._named(sample.stack)
            key = (sample.labels, sample.thread_ident if names else 0)
            labels = labels_cache.get(key)
            if labels is None:
                labels = self._labels(sample.labels, names.get(sample.thread_ident))
                labels_cache[key] = labels
            writer.add(stack, sample.value, labels, stack_key=id(stack))
        duration = max(window.end_ns - window.start_ns, 0)
        return [w.encode(window.start_ns, duration) for w in writers.values() if len(w)]

    def _labels(
        self, labels: Tuple[int, int, int, int, int], thread: Optional[str]
    ) -> Tuple[Tuple[str, str], ...]:
        # Once per span seen in an upload, which is nearly once per sample: kept short.
        span, trace_hi, trace_lo, root, tagset = labels
        out = context.tagset(tagset) if tagset else ()
        if self.config.root_spans_only:
            span = root
        if span:
            out += (("span_id", f"{span:016x}"), ("trace_id", f"{trace_hi:016x}{trace_lo:016x}"))
        if thread is not None:
            out += (("thread_name", thread),)
        return out  # a tuple: the writer interns it once (see ProfileWriter.add)

    def _app_name(self) -> str:
        tags = ",".join(f"{k}={_tag_value(v)}" for k, v in self.config.tags.items())
        return f"{self.config.application_name}{{{tags}}}"

    @property
    def sampler_name(self) -> str:
        return str(self._sampler.name)

    @property
    def upload_stats(self) -> Any:
        return self._uploader.stats

    @property
    def sampler_stats(self) -> Dict[str, int]:
        """The sampler's own counts: threads sampled, samples lost, windows dropped."""
        return {**self._sampler.stats(), "dropped_samples": self.dropped_samples}

    @property
    def collectors(self) -> Dict[str, str]:
        """The collectors running besides the sampler: name -> "native" or "python"."""
        return {c.name: c.implementation for c in self._collectors}

    def collector_stats(self) -> Dict[str, Dict[str, int]]:
        return {c.name: dict(c.stats()) for c in self._collectors}


def _tag_value(value: str) -> str:
    return "".join(c for c in str(value) if c not in NAME_SYNTAX_CHARS)


def _thread_names() -> Dict[int, str]:
    return {t.ident: t.name for t in threading.enumerate() if t.ident is not None}


_fork_handler_registered = False


def _register_fork_handler() -> None:
    # register_at_fork cannot be undone, so one handler serves whichever agent is current.
    global _fork_handler_registered
    if not _fork_handler_registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _fork_handler_registered = True


def _after_fork_in_child() -> None:
    from hotspan import agent as agent_module

    context.reset_after_fork()
    agent_module.reset_after_fork()
    agent = agent_module.current_agent()
    if agent is not None:
        agent.after_fork_in_child()
