"""The agent: a sampler (native, or the Python fallback) and a Python thread that, whenever the
sampler has finished a window (every ``upload_interval``), turns it into one CPU and one wall
pprof for the uploader.  With the native sampler that thread is not on the sampling path: if
a busy program keeps it from the GIL, windows wait for it (bounded) and nothing is lost."""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import Any, Dict, List, Optional, Tuple

from hotspan import __version__
from hotspan.agent import context
from hotspan.agent.config import NAME_SYNTAX_CHARS, AgentConfig, request_headers
from hotspan.agent.pprof_writer import ProfileWriter
from hotspan.agent.sampler import CPU, WALL, PythonSampler, Window, make_sampler
from hotspan.agent.symbols import Symbolizer
from hotspan.agent.uploader import Uploader

logger = logging.getLogger("hotspan.agent")

CPU_TYPE = ("cpu", "nanoseconds")
WALL_TYPE = ("wall", "nanoseconds")


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._sampler = make_sampler(
            config.sample_rate, config.max_depth, config.cpu, config.wall, config.native
        )
        self._symbols = Symbolizer()
        self._uploader = Uploader(
            config.server_address,
            request_headers(config),
            max_buffer_bytes=config.max_buffer_bytes,
            timeout=config.upload_timeout,
            user_agent=f"hotspan-agent/{__version__}",
        )
        self._lock = threading.Lock()
        self.span_linking = False
        self.dropped_samples = 0  # taken but not kept: the sampler's ring or memory bound

    # -------------------------------------------------------------- lifecycle

    def start(self) -> None:
        if self.config.trace_correlation:
            self.span_linking = context.install_span_linking(
                self.config.root_spans_only, native=self._sampler.name == "native"
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
        self._uploader.start()
        ident = self._uploader.thread_ident
        if ident is not None:
            self._sampler.exclude(ident)
        self._start_thread()

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
        interval = self._sampler.tick_interval
        while not self._stop.wait(interval):
            try:
                self._sampler.tick()
                self._upload(final=False)
            except Exception:  # noqa: BLE001 - a bug here must not stop the program
                logger.warning("hotspan: sampling failed; profiling stops", exc_info=True)
                return

    # -------------------------------------------------------------- uploads

    def _upload(self, final: bool) -> None:
        """Encodes and queues the windows the sampler has finished (with ``final``, the one
        in progress too)."""
        with self._lock:
            collected = self._sampler.collect(final=final)
            self.dropped_samples += collected.lost
            period = 1_000_000_000 // self.config.sample_rate
            batches = [(w, self._encode(w, period)) for w in collected.windows]
            del collected
        for window, bodies in batches:
            start_s = window.start_ns // 1_000_000_000
            params = {
                "name": self._app_name(),
                "from": str(start_s),
                "until": str(max(window.end_ns // 1_000_000_000, start_s + 1)),
                "format": "pprof",
                "sampleRate": str(self.config.sample_rate),
                "spyName": "hotspan",
            }
            for body in bodies:
                self._uploader.submit(params, body)

    def _encode(self, window: Window, period: int) -> List[bytes]:
        writers = {
            CPU: ProfileWriter(CPU_TYPE, CPU_TYPE, period),
            WALL: ProfileWriter(WALL_TYPE, WALL_TYPE, period),
        }
        frame = self._symbols.frame
        names = _thread_names() if self.config.thread_name_label else {}
        labels_cache: Dict[Tuple[Any, ...], List[Tuple[str, str]]] = {}
        for sample in window.samples:
            writer = writers.get(sample.kind)
            if writer is None:
                continue
            stack = [frame(code, lasti) for code, lasti in sample.stack]
            key = (sample.labels, sample.thread_ident if names else 0)
            labels = labels_cache.get(key)
            if labels is None:
                labels = self._labels(sample.labels, names.get(sample.thread_ident))
                labels_cache[key] = labels
            writer.add(stack, sample.value, labels)
        duration = max(window.end_ns - window.start_ns, 0)
        return [w.encode(window.start_ns, duration) for w in writers.values() if len(w)]

    def _labels(
        self, labels: Tuple[int, int, int, int, int], thread: Optional[str]
    ) -> List[Tuple[str, str]]:
        span, trace_hi, trace_lo, root, tagset = labels
        out = list(context.tagset(tagset))
        if self.config.root_spans_only:
            span = root
        if span:
            out.append(("span_id", format(span, "016x")))
            out.append(("trace_id", format(trace_hi, "016x") + format(trace_lo, "016x")))
        if thread is not None:
            out.append(("thread_name", thread))
        return out

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
