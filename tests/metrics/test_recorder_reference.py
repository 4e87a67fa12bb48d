"""Recording rules' counters against a reference that reads every sample of every upload one
by one: its series' labels through the rule's selectors, its stack's frames by name through
the rule's function regex.  The recorder remembers verdicts per series, frame and stack
across batches; these tests count each upload several times over (the later passes answered
from that memory) and require the reference's sums, exactly, after every pass.

Uploads: a recording made by OpenJDK 17's own recorder (read by the JFR reader, C and
Python), and pprof pushes through the server's own decoder whose stacks repeat across
uploads, share frames, differ by line only, and change from one upload to the next."""

from __future__ import annotations

import gzip
import random
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

from hotspan.formats import jfr_profiles, pprof
from hotspan.metrics import stacks as stacks_module
from hotspan.metrics.recorder import Recorder
from hotspan.metrics.rules import RULE_ID_LABEL, RecordingRule, from_json
from hotspan.model.labels import METRIC_NAME
from hotspan.model.profile import Frame, IngestBatch, ProfileType
from hotspan.query.engine import synthetic_labels

JFR = Path(__file__).parent.parent / "formats" / "data" / "jdk17-cpu-alloc-lock-park.jfr.gz"
CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
Totals = Dict[Tuple[str, Tuple[str, ...]], int]


def reference(batches: List[IngestBatch], rules: List[RecordingRule]) -> Totals:
    """Per (rule, group): the sum of the values of the samples the rule takes, one at a
    time; a group whose series matched shows even at 0."""
    out: Totals = {}
    for batch in batches:
        stacks: Dict[int, Tuple[int, ...]] = dict(batch.stacks)
        for chunk in batch.stack_chunks:
            for i, sid in enumerate(chunk.ids.tolist()):
                stacks[sid] = tuple(chunk.frames[chunk.offsets[i] : chunk.offsets[i + 1]].tolist())
        wanted: Set[int] = {f for frames in stacks.values() for f in frames}
        names = {fid: frame.name for fid, frame in batch.frames_for(wanted).items()}
        cols = batch.columns()
        for sid, stack, value in zip(
            cols.series_id.tolist(), cols.stack_id.tolist(), cols.value.tolist()
        ):
            info = batch.series[sid]
            labels = dict(info.labels)
            labels.setdefault(METRIC_NAME, info.profile_type.name)
            labels.update(synthetic_labels(info.profile_type))
            for rule in rules:
                if info.profile_type != rule.profile_type:
                    continue
                if not all(s.matches(labels) for s in rule.selectors()):
                    continue
                key = (rule.id, tuple(labels.get(n, "") for n in rule.group_by))
                matcher = rule.function_matcher()
                hit = matcher is None or any(
                    f in names and matcher.matches(names[f]) for f in stacks.get(stack, ())
                )
                out[key] = out.get(key, 0) + (value if hit else 0)
    return out


def recorded(recorder: Recorder, tenant: str) -> Totals:
    out: Totals = {}
    for family in recorder.families(tenant):
        for sample in family.samples:
            rule_id = sample.labels[RULE_ID_LABEL]
            rule = next(a.rule for a in recorder._active[tenant] if a.rule.id == rule_id)
            out[(rule_id, tuple(sample.labels.get(n, "") for n in rule.group_by))] = int(
                sample.value
            )
    return out


def rules_of(bodies: Dict[str, dict]) -> List[RecordingRule]:
    return [from_json(body, rule_id)[0] for rule_id, body in bodies.items()]


def rule(n: int, profile_type: str, selector: str, group_by: List[str], fn: str = "") -> dict:
    body = {
        "metricName": f"profiles_recorded_test_{n}_total",
        "profileType": profile_type,
        "selector": selector,
        "groupBy": group_by,
    }
    if fn:
        body["functionName"] = fn
    return body


def check(batches: List[IngestBatch], rules: List[RecordingRule], passes: int = 3) -> Totals:
    recorder = Recorder(None)  # type: ignore[arg-type]  # load() needs no store
    recorder.load({"t": rules})
    one = reference(batches, rules)
    assert any(v for v in one.values()), "the rules take no sample: the test would prove nothing"
    for n in range(1, passes + 1):
        for batch in batches:
            recorder.count("t", batch)
        assert recorded(recorder, "t") == {k: v * n for k, v in one.items()}, f"pass {n}"
    return one


@pytest.mark.parametrize("reader", ["c", "python"])
def test_rules_match_the_reference_on_a_jdk_recording(reader: str) -> None:
    native = reader == "c"
    if native and jfr_profiles._fast is None:
        pytest.skip("the C extension hotspan._speedups._jfr is not built")
    data = gzip.decompress(JFR.read_bytes())
    batches = []
    for i in range(3):
        batch = IngestBatch()
        labels = jfr_profiles.series_labels(f"svc-{i % 2}", {"pod": f"p{i}"}, "cpu")
        decoded = jfr_profiles.decode(data, 100, native=native)
        jfr_profiles.to_batch(decoded, batch, labels, 10**18 + i)
        batches.append(batch)
    types = sorted({info.profile_type.id for b in batches for info in b.series.values()})
    assert len(types) >= 3, types
    bodies: Dict[str, dict] = {}
    for n, ptype in enumerate(types):
        bodies[f"all-{n}"] = rule(n, ptype, "{}", ["service_name"])
        bodies[f"work-{n}"] = rule(100 + n, ptype, "{}", ["pod"], r"Work\..*")
        bodies[f"contend-{n}"] = rule(200 + n, ptype, '{service_name="svc-0"}', [], ".*contend.*")
        bodies[f"lambda-{n}"] = rule(300 + n, ptype, "{}", [], r".*lambda\$.*")
        bodies[f"jdk-{n}"] = rule(400 + n, ptype, '{pod!="p1"}', ["pod"], r"java\.util\..*")
        bodies[f"none-{n}"] = rule(500 + n, ptype, "{}", [], "no.such.function")
    totals = check(batches, rules_of(bodies))
    # The regexes took part of what the selectors took, and none took nothing by mistake.
    for n in range(len(types)):
        work = sum(v for (r, _), v in totals.items() if r == f"work-{n}")
        assert 0 <= work <= sum(v for (r, _), v in totals.items() if r == f"all-{n}")
    assert any(v for (r, _), v in totals.items() if r.startswith("work-"))
    assert all(v == 0 for (r, _), v in totals.items() if r.startswith("none-"))


MODULES = ["app.api", "app.db", "sqlalchemy.orm", "json.decoder", "re", "asyncio.tasks"]


def pprof_uploads(n: int, seed: int) -> List[Tuple[bytes, Dict[str, str]]]:
    rng = random.Random(seed)
    functions = [f"{m}.f{i}" for m in MODULES for i in range(12)]
    # Frames of one function on several lines: a verdict per function name, not per frame.
    frames = [Frame(fn, f"/src/{fn.split('.')[0]}.py", line) for fn in functions for line in (1, 2)]
    pool = [[rng.choice(frames) for _ in range(rng.randint(0, 12))] for _ in range(150)]
    uploads = []
    for i in range(n):
        builder = pprof.ProfileBuilder.of_type(ProfileType.parse(CPU), 10_000_000)
        # Mostly the same stacks from one upload to the next, a few new ones every time.
        chosen = rng.sample(pool, 60) + [
            [rng.choice(frames) for _ in range(rng.randint(1, 10))] for _ in range(5)
        ]
        for stack in chosen:
            builder.add(stack, rng.randint(1, 50) * 10_000_000)
        body = gzip.compress(builder.profile.SerializeToString())
        labels = {"service_name": f"svc-{i % 3}", "region": f"r{i % 2}", "pod": f"p{i % 5}"}
        uploads.append((body, labels))
    return uploads


def pprof_batches(uploads: List[Tuple[bytes, Dict[str, str]]], per_batch: int) -> List[IngestBatch]:
    batches = []
    for start in range(0, len(uploads), per_batch):
        batch = IngestBatch()  # several uploads in one batch: several series
        for body, labels in uploads[start : start + per_batch]:
            pprof.to_batch(pprof.parse(body, 1 << 24), batch, labels, 10**18)
        batches.append(batch)
    return batches


PPROF_RULES = {
    "by-service": rule(1, CPU, "{}", ["service_name"]),
    "sqlalchemy": rule(2, CPU, '{service_name="svc-0"}', ["region"], r"sqlalchemy\..*"),
    "db-or-json": rule(3, CPU, "{}", ["service_name", "pod"], r"(app\.db|json)\..*"),
    "f1": rule(4, CPU, '{region="r1"}', [], r".*\.f1"),
    "tasks": rule(5, CPU, '{service_name=~"svc-1|svc-2"}', ["pod"], r"asyncio\.tasks\..*"),
    "everything": rule(6, CPU, "{}", [], ".*"),
    "re-module": rule(7, CPU, "{}", ["region"], r"re\..*"),
}


@pytest.mark.parametrize("per_batch", [1, 4])
def test_rules_match_the_reference_on_pprof_pushes(per_batch: int) -> None:
    batches = pprof_batches(pprof_uploads(24, seed=per_batch), per_batch)
    totals = check(batches, rules_of(PPROF_RULES))
    everything = sum(v for (r, _), v in totals.items() if r == "everything")
    by_service = sum(v for (r, _), v in totals.items() if r == "by-service")
    # Empty stacks hold no function: ".*" takes less than every sample.
    assert 0 < everything < by_service


def test_rules_match_the_reference_when_their_memory_overflows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Verdicts forgotten (the memory full) are reached again, the same."""
    monkeypatch.setattr(stacks_module, "FRAME_CACHE_LIMIT", 40)
    monkeypatch.setattr(stacks_module, "STACK_CACHE_LIMIT", 50)
    batches = pprof_batches(pprof_uploads(12, seed=7), 1)
    check(batches, rules_of(PPROF_RULES))


def test_a_frame_the_batch_cannot_name_is_judged_once_named() -> None:
    """A batch that holds a stack whose frames it cannot name (no source for them) counts
    it as not matching; a later batch naming them counts it as matching: the first
    verdict is not remembered as final."""
    frame = Frame("sqlalchemy.orm.Query.all", "/q.py", 3)
    named = IngestBatch()
    fid = named.add_frame(frame)
    stack = named.add_stack((fid,))
    sid = named.add_series(ProfileType.parse(CPU), (("service_name", "svc-0"),))
    named.add_sample(sid, 10**18, stack, 7)
    unnamed = IngestBatch()
    unnamed.stacks[stack] = (fid,)
    unnamed.series[sid] = named.series[sid]
    unnamed.add_sample(sid, 10**18, stack, 5)
    rules = rules_of({"sqlalchemy": rule(1, CPU, "{}", [], r"sqlalchemy\..*")})
    recorder = Recorder(None)  # type: ignore[arg-type]
    recorder.load({"t": rules})
    recorder.count("t", unnamed)
    assert recorded(recorder, "t") == {("sqlalchemy", ()): 0}
    recorder.count("t", named)
    recorder.count("t", unnamed)
    # The frame, named once, is known to match from then on.
    assert recorded(recorder, "t") == {("sqlalchemy", ()): 12}


def test_the_worker_counts_every_submitted_batch_once() -> None:
    """Through the worker thread, as a server counts: every submitted batch counted once,
    and a flush returns once what was submitted before it is counted."""
    batches = pprof_batches(pprof_uploads(12, seed=11), 1)
    rules = rules_of(PPROF_RULES)
    one = reference(batches, rules)
    recorder = Recorder(None)  # type: ignore[arg-type]
    recorder.load({"t": rules})
    recorder.start()
    try:
        for n in (1, 2):
            for batch in batches:
                recorder.submit("t", batch)
            assert recorder.flush(30.0)
            assert recorded(recorder, "t") == {k: v * n for k, v in one.items()}
    finally:
        recorder.stop()
    assert not any(t.is_alive() for t in recorder._threads)
