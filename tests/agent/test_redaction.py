"""What leaves the process: redacted names and label values, and uploads within
max_profile_size with their totals intact (real programs, a real server, and the pprof the
agent writes read back with the protobuf schema)."""

from __future__ import annotations

import gzip
import random
import uuid
from pathlib import Path

import pytest

from hotspan.agent.config import ConfigError, from_env
from hotspan.agent.limits import BoundedProfile
from hotspan.formats.proto import profile_pb2
from hotspan.model.redaction import REDACTED, Redactor
from tests.agent.test_agent import CPU, TOTAL, run_program, service_profile
from tests.helpers import label_values


def test_default_words_and_own_patterns() -> None:
    default = Redactor(from_env({}, application_name="x").redact_patterns())
    assert default("app.reset_PASSWORD") == REDACTED
    assert default("/srv/secrets/keys.py") == REDACTED
    assert default("app.handle_request") == "app.handle_request"
    assert default.labels((("user", "api-Token-1"), ("route", "/a"))) == (
        ("user", REDACTED),
        ("route", "/a"),
    )
    own = Redactor([r"acct_\d+", "ssn"])
    assert own("billing.acct_1234") == REDACTED and own("password") == "password"
    assert not Redactor([])  # off: nothing checked at all
    off = from_env({"HOTSPAN_REDACT": "none"}, application_name="x")
    assert off.redact_patterns() == []
    listed = from_env({"HOTSPAN_REDACT": '["a,b", "c"]'}, application_name="x")
    assert listed.redact_patterns() == ["a,b", "c"]
    with pytest.raises(ConfigError, match="redact pattern"):
        from_env({}, application_name="x", redact=["(unclosed"]).validate()


def test_file_names_are_redacted_apart_from_function_names(tmp_path: Path) -> None:
    from hotspan.agent.symbols import Symbolizer

    source = "def unseal():\n    return 1\n"
    code = compile(source, str(tmp_path / "customer_secrets" / "vault.py"), "exec")
    namespace: dict = {}
    exec(code, namespace)
    unseal = namespace["unseal"].__code__
    named = Symbolizer(Redactor(["secret"])).frame(unseal, 0)
    assert named[0].endswith("unseal") and named[1] == REDACTED
    assert Symbolizer().frame(unseal, 0)[1].endswith("vault.py")


def _names(profile: profile_pb2.Profile) -> set:
    out = set()
    for function in profile.function:
        name = profile.string_table[function.name]
        out.add(name.decode() if isinstance(name, bytes) else name)
    return out


def _decode(body: bytes) -> profile_pb2.Profile:
    profile = profile_pb2.Profile()
    profile.ParseFromString(gzip.decompress(body))
    return profile


def test_an_oversized_profile_keeps_its_largest_stacks_and_every_total() -> None:
    rng = random.Random(7)
    limit = 4096
    bounded = BoundedProfile([("alloc", "count"), ("alloc", "bytes")], ("space", "bytes"), 1, limit)
    expected = [0, 0]
    rows = []
    for i in range(3000):
        stack = tuple(
            (f"module_{i % 50}.function_{i}_{d}", f"/srv/app/m{i % 50}.py", d + 1, 1)
            for d in range(rng.randint(3, 20))
        )
        values = (rng.randint(1, 50), rng.randint(1, 1 << 20))
        rows.append((values[1], stack))
        bounded.add(stack, values, (("span_id", f"{i:016x}"),))
        expected = [expected[0] + values[0], expected[1] + values[1]]
    body = bounded.encode(1_700_000_000 * 10**9, 10**10)
    assert len(body) <= limit
    assert 0 < bounded.folded_stacks < 3000
    profile = _decode(body)
    totals = [sum(s.value[k] for s in profile.sample) for k in range(2)]
    assert totals == expected
    names = _names(profile)
    assert "other" in names
    # What was kept are the largest stacks (by their values' sum, the bytes here).
    kept = len(profile.sample) - 1
    largest = sorted(rows, key=lambda r: r[0], reverse=True)[:kept]
    assert all(stack[0][0] in names for _, stack in largest)


def test_a_profile_within_the_limit_is_untouched() -> None:
    bounded = BoundedProfile(("cpu", "nanoseconds"), ("cpu", "nanoseconds"), 10**7, 4096)
    bounded.add((("main.f", "main.py", 1, 1),), 5)
    body = bounded.encode(0, 10**9)
    assert bounded.folded_stacks == 0
    assert "other" not in _names(_decode(body))


def test_no_matching_name_or_label_value_reaches_the_server(module_server, tmp_path: Path) -> None:
    service = f"redact_{uuid.uuid4().hex[:6]}"
    secret_dir = tmp_path / "customer_secrets"
    secret_dir.mkdir()
    (secret_dir / "vault.py").write_text("def unseal(burn):\n    burn(0.3)\n")
    result = run_program(
        tmp_path,
        f"""
sys.path.insert(0, {str(secret_dir)!r})
import vault
agent = hotspan.configure(application_name={service!r}, server_address={module_server.url!r},
                          upload_interval=60, thread_name_label=True,
                          tags={{"deploy_key": "prod-credential-7"}})

def reset_password(seconds):
    burn(seconds)

worked, uploaded = threading.Event(), threading.Event()

def worker():
    with hotspan.tag_wrapper({{"user": "token-of-alice", "route": "/reset"}}):
        reset_password(0.4)
        vault.unseal(burn)
    worked.set()
    uploaded.wait(30)  # alive while the upload names the threads

t = threading.Thread(target=worker, name="secret-keeper")
t.start()
worked.wait(30)
hotspan.shutdown()
uploaded.set()
t.join()
report(sent=agent.upload_stats.sent_uploads)
""",
        otel=False,
    )
    assert result["sent"] >= 2
    with module_server.client() as client:
        cpu = service_profile(client, f'{{service_name="{service}"}}', CPU)
        assert cpu[TOTAL] > 0.5e9
        assert cpu.get(REDACTED, 0) > 0.3e9  # reset_password
        assert cpu.get("vault.unseal", 0) > 0.2e9  # only its file's path matches
        for name in cpu:
            assert not any(w in name.lower() for w in ("password", "secret")), name
        assert label_values(client, service, "user") == [REDACTED]
        assert label_values(client, service, "route") == ["/reset"]
        threads = label_values(client, service, "thread_name")
        assert REDACTED in threads and "secret-keeper" not in threads
        assert label_values(client, service, "deploy_key") == [REDACTED]


def test_uploads_stay_within_max_profile_size(module_server, tmp_path: Path) -> None:
    """A program with thousands of distinct stacks: each upload is within the limit, the
    smallest stacks are in "other", and the CPU total is what the process burnt."""
    service = f"bounded_{uuid.uuid4().hex[:6]}"
    result = run_program(
        tmp_path,
        f"""
names = [f"f{{i}}_{{os.urandom(6).hex()}}" for i in range(3000)]
exec("".join(f"def {{n}}(s):\\n    burn(s)\\n" for n in names))
funcs = [globals()[n] for n in names]
agent = hotspan.configure(application_name={service!r}, server_address={module_server.url!r},
                          upload_interval=60, max_profile_size=4096, wall=False,
                          sample_rate=1000, alloc_sample_bytes=0, locks=False, threads=False,
                          redact=[])
start = time.process_time()
for i, f in enumerate(funcs):
    f(0.3 if i < 3 else 0.0005)
spent = time.process_time() - start
hotspan.shutdown()
stats = agent.upload_stats
report(spent=spent, sent=stats.sent_uploads, bytes=stats.sent_bytes)
""",
        otel=False,
    )
    assert result["sent"] == 1
    assert result["bytes"] <= 4096
    with module_server.client() as client:
        cpu = service_profile(client, f'{{service_name="{service}"}}', CPU)
    assert cpu.get("other", 0) > 0
    biggest = sorted(cpu.items(), key=lambda kv: kv[1], reverse=True)
    top = [n[:3] for n, _ in biggest if n.startswith("f")][:3]
    assert sorted(top) == ["f0_", "f1_", "f2_"]
    spent_ns = result["spent"] * 1e9
    assert 0.85 * spent_ns < cpu[TOTAL] < 1.15 * spent_ns, (cpu[TOTAL], spent_ns)
