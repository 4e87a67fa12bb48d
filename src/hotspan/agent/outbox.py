"""What the agent sends: the sampler's windows and the collectors' profiles, held until the
spans in them have ended, their stacks named and their samples labelled, encoded as pprof and
queued on the uploader (and fed to pull mode's hub, when its endpoints exist).

The agent's loop calls it once an upload interval, and its shutdown once more: never on the
sampling path."""

from __future__ import annotations

import sys
import threading
import time

from hotspan.agent import context
from hotspan.agent.config import NAME_SYNTAX_CHARS
from hotspan.agent.log import logger
from hotspan.agent.sampler import (
    CPU,
    GIL_HELD,
    WALL_CPU_WAIT,
    WALL_GIL_WAIT,
    WALL_RELEASED,
    WALL_RUNNING,
    Collected,
)
from hotspan.agent.symbols import GC_FRAME_NAME, GC_GENERATION_LABEL, Symbolizer, gc_generation
from hotspan.model.redaction import Redactor

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Dict, Iterable, Iterator, List, Optional, Set, Tuple

    from hotspan.agent.collectors import Collector, ProfileData
    from hotspan.agent.config import AgentConfig
    from hotspan.agent.limits import BoundedProfile
    from hotspan.agent.sampler import Window
    from hotspan.agent.symbols import FrameInfo
    from hotspan.agent.uploader import Uploader


CPU_TYPE = ("cpu", "nanoseconds")
WALL_TYPE = ("wall", "nanoseconds")
# Wall time waiting for the GIL, on the waiter's stack and span; and the same time on the stack
# of the thread that held it meanwhile ("whose code makes the others wait").  Their own profiles
# (gil_wait:gil_wait:..., gil_held:gil_held:...), with wall time's period.
GIL_WAIT_TYPE = ("gil_wait", "nanoseconds")
GIL_HELD_TYPE = ("gil_held", "nanoseconds")
# The label wall samples carry where the sampler tells the thread's state: holding the GIL
# ("running"), waiting for it ("gil_wait"), runnable but waiting for a core ("cpu_wait"), or
# none of these ("released": off CPU for I/O, a sleep or a lock, or running native code that
# let the GIL go).
THREAD_STATE_LABEL = "thread_state"
_STATE_OF_KIND = {
    WALL_RUNNING: "running",
    WALL_GIL_WAIT: "gil_wait",
    WALL_RELEASED: "released",
    WALL_CPU_WAIT: "cpu_wait",
}
CONDITION_LABEL = "hotspan_condition"
# A window waits for its spans to end this many upload intervals, and at least this long.
HOLD_INTERVALS = 3
HOLD_MIN_S = 30.0
_UNSEEN = object()
_NOTHING_TAKEN = Collected([], 0, None)


def pull_hub() -> Any:
    """Pull mode's hub, when its endpoints exist.  The module is imported only by what serves
    them: its functions and classes would otherwise be objects that every full collection of
    the program's garbage collector walks."""
    # Another thread may be importing it: a module is in sys.modules before its names exist.
    return getattr(sys.modules.get("hotspan.agent.pull"), "HUB", None)


class Outbox:
    """``uploading``: False in pull mode, where nothing is queued on ``uploader`` and the pull
    hub alone is fed."""

    def __init__(self, config: AgentConfig, uploader: Uploader, uploading: bool) -> None:
        self.config = config
        self._uploader = uploader
        self._uploading = uploading
        self.redact = Redactor(config.redact_patterns())
        self._symbols = Symbolizer(self.redact if self.redact else None)
        self._label_cache: Dict[Tuple[Any, ...], Optional[Tuple[Tuple[str, str], ...]]] = {}
        # Held while the sampler's windows are taken and encoded: the loop and a shutdown on
        # the program's thread may both upload.
        self._lock = threading.Lock()
        self.dropped_samples = 0  # taken but not kept: the sampler's ring or memory bound
        # Span conditions (agent/spans.py), set by the agent when some rule is on; windows and
        # collectors' profiles wait in the held lists for their spans to end (see _release).
        self.conditions: Any = None
        self.conditional_only = False
        self.conditional_dropped = 0
        self._held_windows: List[Any] = []
        self._held_profiles: List[Any] = []
        self._next_release_check = 0.0

    def after_fork(self) -> None:
        # The parent's threads are gone, and any lock one of them held (a window being
        # encoded as the fork happened) would stay held here forever.  What waits for its
        # spans is the parent's to send, as the rest of its data.
        self._lock = threading.Lock()
        self._held_windows, self._held_profiles = [], []

    @property
    def holds_windows(self) -> bool:
        return bool(self._held_windows)

    def upload(
        self, sampler: Any, rate: int, final: bool, taken: Optional[Tuple[Any, int]] = None
    ) -> None:
        """Encodes and queues the windows ``sampler`` has finished (with ``final``, the one
        in progress too, and what waits for its spans), once the spans in them have ended
        (see :meth:`_release`).  ``taken``: what a stopped sampler gave, with its period."""
        with self._lock:
            hub = pull_hub()
            cut = hub.begin_cut() if hub is not None and taken is None else None
            if taken is None:
                collected = sampler.cut() if cut else sampler.collect(final=final)
                period = 1_000_000_000 // rate
            else:
                collected, period = taken
                del taken
            self.dropped_samples += collected.lost
            if hub is not None:
                hub.feed_windows(self, collected.windows, period)
                if cut:
                    hub.end_cut(cut)
            if not self._uploading:
                return
            windows = self._release(
                self._held_windows, [(w, period) for w in collected.windows], final
            )
            if windows:
                self._label_cache = {}  # a new upload: thread names as they are now
            batches = [(w, self._encode(w, p), p) for w, p in windows]
            del collected, windows
        for window, bodies, period in batches:
            sampled_at = 1_000_000_000 // period if period else rate
            params = self._params(window.start_ns, window.end_ns, sampled_at)
            for body in bodies:
                self._uploader.submit(params, body)

    def upload_held(self, rate: int, final: bool) -> None:
        """The windows waiting for their spans, with no sampler running to bring new ones."""
        self.upload(None, rate, final, taken=(_NOTHING_TAKEN, 1_000_000_000 // rate))

    def collect(self, collectors: List[Collector], rate: int) -> None:
        """A round of the collectors, sent; one that fails is stopped and taken out of
        ``collectors``."""
        try:
            self._send_collected(collectors, rate)
        finally:
            self._label_cache = {}  # the upload is done: next time, fresh thread names

    def _send_collected(self, collectors: List[Collector], rate: int) -> None:
        for collector in list(collectors):
            try:
                profiles = collector.collect(final=False)
            except Exception:  # noqa: BLE001 - that profile stops, the others go on
                logger.warning(
                    "hotspan: the %s profile failed; it stops", collector.name, exc_info=True
                )
                collectors.remove(collector)
                collector.stop()
                continue
            self.send_profiles(profiles, rate)

    def send_profiles(self, profiles: List[ProfileData], rate: int, final: bool = False) -> None:
        """Encodes a collector's profiles (once their spans have ended, see :meth:`_release`)
        and queues them for upload, as sampled at ``rate``."""
        hub = pull_hub()
        if hub is not None:
            hub.add_profiles(self, profiles)
        if not self._uploading:
            return
        ready = self._release(self._held_profiles, [(p,) for p in profiles], final)
        for (profile,) in ready:
            if not profile.samples:
                continue
            writer = self._writer(profile.sample_types, profile.period_type, profile.period)
            for sample, named, labels in self._prepared(profile.samples):
                writer.add(named, sample.values, labels, stack_key=id(named))
            if len(writer):
                duration = max(profile.end_ns - profile.start_ns, 0)
                body = writer.encode(profile.start_ns, duration)
                self._uploader.submit(self._params(profile.start_ns, profile.end_ns, rate), body)

    def _release(self, held: List[Any], new: List[Any], final: bool) -> List[Any]:
        """What of ``held`` and ``new`` (windows or collectors' profiles, each with what it
        needs) can be encoded now; the rest stays in ``held``.

        With span conditions on, a sample gets its span's condition when the span has ended,
        which is often after the window it was sampled in: a window waits until every span in
        it (and its local root) has ended, for HOLD_INTERVALS upload intervals at most."""
        conditions = self.conditions
        if conditions is None or not conditions.hooked:
            ready = held + new
            held.clear()
            return ready
        now = time.monotonic()
        wait = max(HOLD_MIN_S, HOLD_INTERVALS * self.config.upload_interval)
        held.extend([now + wait, item] for item in new)
        if not final and not new and now < self._next_release_check:
            return []  # looked at less than a second ago: spans end at their own pace
        self._next_release_check = now + 1.0
        ready, keep = [], []
        for entry in held:
            if final or now >= entry[0] or self._settled(entry[1][0].samples, conditions):
                ready.append(entry[1])
            else:
                keep.append(entry)
        held[:] = keep
        return ready

    @staticmethod
    def _settled(samples: Any, conditions: Any) -> bool:
        """Whether every span of these samples has ended, with its local ancestors."""
        seen: Set[int] = set()
        for sample in samples:
            span = sample.labels[0]
            if span and span not in seen:
                seen.add(span)
                if not conditions.lineage(span)[1]:
                    return False
        return True

    def _params(self, start_ns: int, end_ns: int, rate: int) -> Dict[str, str]:
        start_s = start_ns // 1_000_000_000
        return {
            "name": self.app_name(),
            "from": str(start_s),
            "until": str(max(end_ns // 1_000_000_000, start_s + 1)),
            "format": "pprof",
            "sampleRate": str(rate),
            "spyName": "hotspan",
        }

    def _label_sets(self) -> Dict[Tuple[Any, ...], Optional[Tuple[Tuple[str, str], ...]]]:
        """Label tuples by (raw labels, thread), shared by the CPU, wall and collectors'
        profiles of an upload: a span's samples are in each.  Started afresh as it grows past
        one upload's worth (thread names change, idents are reused)."""
        if len(self._label_cache) > 50_000:
            self._label_cache = {}
        return self._label_cache

    def named(self, stack: Any) -> Tuple[FrameInfo, ...]:
        return self._symbols.name_stack(stack)

    def _prepared(self, samples: Iterable[Any]) -> Iterator[Tuple[Any, Tuple[FrameInfo, ...], Any]]:
        """The samples to upload, each with its stack named and its labels; those that
        conditional_only leaves out are counted, not yielded.  Shared by the sampler's windows
        and the collectors' profiles."""
        names = _thread_names() if self.config.thread_name_label else {}
        labels_cache = self._label_sets()
        # A stack stands in many samples (CPU and wall, one per span seen there): it is named
        # once.  By id: the sampler and collectors hand the same tuple for the same stack (and
        # keep it alive meanwhile), and hashing a stack of code objects costs more than naming
        # it (see Symbolizer).
        named_cache: Dict[int, Tuple[FrameInfo, ...]] = {}
        for sample in samples:
            key = (sample.labels, sample.thread_ident if names else 0)
            labels = labels_cache.get(key, _UNSEEN)
            if labels is _UNSEEN:
                labels = self.labels(sample.labels, names.get(sample.thread_ident))
                labels_cache[key] = labels
            if labels is None:  # conditional_only, and its span met no condition
                self.conditional_dropped += 1
                continue
            named = named_cache.get(id(sample.stack))
            if named is None:
                named = named_cache[id(sample.stack)] = self.named(sample.stack)
            if named and named[0][0] == GC_FRAME_NAME:
                generation = gc_generation(named)
                if generation and isinstance(labels, tuple):
                    yield sample, named, labels + ((GC_GENERATION_LABEL, generation),)
                    continue
            yield sample, named, labels

    def _encode(self, window: Window, period: int) -> List[bytes]:
        cpu = self._writer(CPU_TYPE, CPU_TYPE, period)
        wall = self._writer(WALL_TYPE, WALL_TYPE, period)
        gil: Dict[int, Any] = {}  # made when a window has GIL waits
        for sample, stack, labels in self._prepared(window.samples):
            kind = sample.kind
            if kind == CPU:
                cpu.add(stack, sample.value, labels, stack_key=id(stack))
                continue
            if kind in (GIL_HELD, WALL_GIL_WAIT):
                writer = gil.get(kind)
                if writer is None:
                    wanted = GIL_HELD_TYPE if kind == GIL_HELD else GIL_WAIT_TYPE
                    writer = gil[kind] = self._writer(wanted, WALL_TYPE, period)
                writer.add(stack, sample.value, labels, stack_key=id(stack))
                if kind == GIL_HELD:
                    continue
            state = _STATE_OF_KIND.get(kind)
            if state is not None and isinstance(labels, tuple):
                labels = labels + ((THREAD_STATE_LABEL, state),)
            wall.add(stack, sample.value, labels, stack_key=id(stack))
        duration = max(window.end_ns - window.start_ns, 0)
        writers = [cpu, wall, *gil.values()]
        return [w.encode(window.start_ns, duration) for w in writers if len(w)]

    def _writer(
        self, sample_types: Any, period_type: Tuple[str, str], period: int
    ) -> BoundedProfile:
        """An encoder of one profile, bounded by max_profile_size: pprof, or OTLP profiles
        with exporter="otlp"."""
        # The encoder (agent/limits.py, agent/pprof_writer.py and its C module) is imported
        # with the first upload, not with the agent: a program that ends sooner never keeps it
        # for its GC to walk.  Once a process; then a look-up in sys.modules per profile.
        from hotspan.agent.limits import BoundedProfile

        config = self.config
        if config.exporter != "otlp":
            return BoundedProfile(sample_types, period_type, period, config.max_profile_size)
        resource = {
            "service.name": config.application_name,
            **{k: self.redact(v) for k, v in config.tags.items()},
        }
        return BoundedProfile(
            sample_types, period_type, period, config.max_profile_size, _otlp_writer(resource)
        )

    def labels(
        self, labels: Tuple[int, int, int, int, int], thread: Optional[str]
    ) -> Optional[Tuple[Tuple[str, str], ...]]:
        """The labels a sample is uploaded with; None to leave it out (conditional_only)."""
        # Once per span seen in an upload, which is nearly once per sample: kept short.
        span, trace_hi, trace_lo, root, tagset = labels
        out = context.tagset(tagset) if tagset else ()
        conditions = self.conditions
        verdict = conditions.lineage(span)[0] if conditions is not None and span else ""
        if not verdict and self.conditional_only:
            return None
        if self.config.root_spans_only:
            span = root
        if span:
            out += (("span_id", f"{span:016x}"), ("trace_id", f"{trace_hi:016x}{trace_lo:016x}"))
        if verdict:
            out += ((CONDITION_LABEL, verdict),)
        if thread is not None:
            out += (("thread_name", thread),)
        return self.redact.labels(out)  # a tuple: the writer interns it once (ProfileWriter.add)

    def app_name(self) -> str:
        """The application name uploads and settings polls carry: the name and its tags."""
        tags = ",".join(f"{k}={_tag_value(self.redact(v))}" for k, v in self.config.tags.items())
        return f"{self.config.application_name}{{{tags}}}"


def _otlp_writer(resource: Dict[str, str]) -> Any:
    """The OTLP encoder's maker, with the profiles' resource."""
    from hotspan.agent.otlp_writer import OtlpProfileWriter

    def make(sample_types: Any, period_type: Tuple[str, str], period: int) -> Any:
        return OtlpProfileWriter(sample_types, period_type, period, resource)

    return make


def _tag_value(value: str) -> str:
    return "".join(c for c in str(value) if c not in NAME_SYNTAX_CHARS)


def _thread_names() -> Dict[int, str]:
    return {t.ident: t.name for t in threading.enumerate() if t.ident is not None}
