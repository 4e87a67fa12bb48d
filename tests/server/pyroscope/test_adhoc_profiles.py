"""Pyroscope's ad hoc profiles over real HTTP, as Grafana Profiles Drilldown's "Ad hoc view"
calls them: a file uploaded in base64, its flame graph as flamebearer JSON in a string, another
sample type asked by ``profile_type``, the list newest first, and what is refused."""

from __future__ import annotations

import base64
import gzip
import json
import uuid
from typing import Dict, List, Tuple

import httpx

from hotspan.formats.proto import profile_pb2

ADHOC = "/adhocprofiles.v1.AdHocProfileService"
# (leaf-first frames, [samples, cpu nanoseconds]), as a Go CPU profile holds them.
SAMPLES: List[Tuple[List[str], List[int]]] = [
    (["runtime.memmove", "main.copy", "main.main"], [3, 30_000_000]),
    (["main.hash", "main.main"], [5, 50_000_000]),
    (["main.main"], [1, 10_000_000]),
]


def go_like_pprof() -> bytes:
    strings = [""]

    def s(text: str) -> int:
        if text not in strings:
            strings.append(text)
        return strings.index(text)

    p = profile_pb2.Profile()
    p.sample_type.add(type=s("samples"), unit=s("count"))
    p.sample_type.add(type=s("cpu"), unit=s("nanoseconds"))
    p.period_type.type, p.period_type.unit = s("cpu"), s("nanoseconds")
    p.period = 10_000_000
    p.default_sample_type = s("cpu")
    ids: Dict[str, int] = {}
    for frames, values in SAMPLES:
        for name in frames:
            if name not in ids:
                ids[name] = len(ids) + 1
                p.function.add(id=ids[name], name=s(name), filename=s("main.go"))
                p.location.add(id=ids[name]).line.add(function_id=ids[name], line=ids[name])
        p.sample.add(location_id=[ids[f] for f in frames], value=values)
    p.string_table.extend(x.encode() for x in strings)
    return gzip.compress(p.SerializeToString())


def call(c: httpx.Client, method: str, body: object, tenant: str) -> httpx.Response:
    return c.post(f"{ADHOC}/{method}", json=body, headers={"X-Scope-OrgID": tenant})


def self_per_function(fb: dict) -> Dict[str, int]:
    """Self values per name from flamebearer levels ([x_delta, total, self, name] per node)."""
    names = fb["names"]
    out: Dict[str, int] = {}
    for level in fb["levels"]:
        for i in range(0, len(level), 4):
            out[names[level[i + 3]]] = out.get(names[level[i + 3]], 0) + level[i + 2]
    return {k: v for k, v in out.items() if v}


def test_a_pprof_file_shows_each_of_its_sample_types(module_server) -> None:  # type: ignore[no-untyped-def]
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    profile = base64.b64encode(go_like_pprof()).decode()
    with module_server.client() as c:
        r = call(c, "Upload", {"name": "cpu profile (1).pb.gz", "profile": profile}, tenant)
        assert r.status_code == 200, r.text
        up = r.json()
        # Pyroscope's id: a ULID, '-', the name with what is not [A-Za-z0-9._-] as '_'.
        ulid, _, name = up["id"].partition("-")
        assert len(ulid) == 26 and name == "cpu_profile__1_.pb.gz" == up["name"]
        assert up["profileTypes"] == ["samples", "cpu"] and up["profileType"] == "cpu"
        cpu = json.loads(up["flamebearerProfile"])
        assert cpu["version"] == 1 and cpu["metadata"]["format"] == "single"
        assert cpu["metadata"]["units"] == "samples"
        assert cpu["metadata"]["sampleRate"] == 1_000_000_000
        assert cpu["flamebearer"]["numTicks"] == sum(v[1] for _, v in SAMPLES)
        assert self_per_function(cpu["flamebearer"]) == {
            "runtime.memmove": 30_000_000,
            "main.hash": 50_000_000,
            "main.main": 10_000_000,
        }
        # The other sample type, asked as Drilldown asks (snake_case).
        r = call(c, "Get", {"id": up["id"], "profile_type": "samples"}, tenant)
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["id"] == up["id"] and got["uploadedAt"] == up["uploadedAt"]
        samples = json.loads(got["flamebearerProfile"])
        assert samples["metadata"]["name"] == "samples"
        assert samples["flamebearer"]["numTicks"] == 9
        r = call(c, "Get", {"id": up["id"], "maxNodes": 2}, tenant)
        assert r.status_code == 200
        small = json.loads(r.json()["flamebearerProfile"])["flamebearer"]
        nodes = sum(len(level) // 4 for level in small["levels"])
        assert nodes < sum(len(level) // 4 for level in cpu["flamebearer"]["levels"])
        assert small["numTicks"] == cpu["flamebearer"]["numTicks"] and "other" in small["names"]
        # Another tenant has no such profile.
        r = call(c, "Get", {"id": up["id"]}, tenant + "-other")
        assert r.status_code == 404 and r.json()["code"] == "not_found"


def test_folded_and_speedscope_files_and_the_list_newest_first(module_server) -> None:  # type: ignore[no-untyped-def]
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    folded = b"main;work;hash 7\nmain;idle 2\n"
    speedscope = {
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "shared": {"frames": [{"name": "main"}, {"name": "work"}]},
        "profiles": [
            {
                "type": "sampled",
                "name": "cpu",
                "unit": "none",
                "startValue": 0,
                "endValue": 4,
                "samples": [[0, 1], [0]],
                "weights": [3, 1],
            }
        ],
    }
    with module_server.client() as c:
        ids = []
        for name, data in (
            ("stacks.folded", folded),
            ("trace.speedscope.json", json.dumps(speedscope).encode()),
        ):
            r = call(
                c, "Upload", {"name": name, "profile": base64.b64encode(data).decode()}, tenant
            )
            assert r.status_code == 200, (name, r.text)
            ids.append(r.json()["id"])
            graph = json.loads(r.json()["flamebearerProfile"])["flamebearer"]
            assert graph["numTicks"] == (9 if name == "stacks.folded" else 4)
        r = call(c, "List", {}, tenant)
        assert r.status_code == 200, r.text
        listed = r.json()["profiles"]
        assert [p["id"] for p in listed] == ids[::-1]
        assert [p["name"] for p in listed] == ["trace.speedscope.json", "stacks.folded"]
        assert all(int(p["uploadedAt"]) > 1_700_000_000_000 for p in listed)
        assert call(c, "List", {}, tenant + "-other").json() == {}


def test_a_tenant_keeps_its_newest_50_files(module_server) -> None:  # type: ignore[no-untyped-def]
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    with module_server.client() as c:
        ids = []
        for i in range(51):
            data = base64.b64encode(f"main;f{i} 1\n".encode()).decode()
            r = call(c, "Upload", {"name": f"p{i}.folded", "profile": data}, tenant)
            assert r.status_code == 200, r.text
            ids.append(r.json()["id"])
        listed = [p["id"] for p in call(c, "List", {}, tenant).json()["profiles"]]
        assert listed == ids[1:][::-1]
        assert call(c, "Get", {"id": ids[0]}, tenant).status_code == 404


def test_bad_uploads_and_lookups_get_connect_errors(module_server) -> None:  # type: ignore[no-untyped-def]
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    good = base64.b64encode(b"a;b 1\n").decode()
    bad = [
        ("Upload", {}),
        ("Upload", {"name": "x"}),
        ("Upload", {"name": 3, "profile": good}),
        ("Upload", {"name": "x", "profile": "not base64!"}),
        ("Upload", {"name": "x.pb.gz", "profile": base64.b64encode(b"\x1f\x8b junk").decode()}),
        ("Upload", {"name": "x.json", "profile": base64.b64encode(b'{"a": 1}').decode()}),
        ("Upload", {"name": "x", "profile": good, "maxNodes": "many"}),
        ("Get", {}),
        ("Get", {"id": "../../etc/passwd"}),
        ("Get", {"id": "x", "profile_type": 5}),
    ]
    with module_server.client() as c:
        for method, body in bad:
            r = call(c, method, body, tenant)
            assert r.status_code == 400, (method, body, r.status_code, r.text)
            assert r.json()["code"] == "invalid_argument", r.text
        # A gzip bomb stops at the server's decompression limit.
        bomb = base64.b64encode(gzip.compress(b"\0" * 200_000_000)).decode()
        r = call(c, "Upload", {"name": "bomb.pb.gz", "profile": bomb}, tenant)
        assert r.status_code == 400, r.text
        huge = base64.b64encode(b"a;b 1\n" * 800_000).decode()
        assert call(c, "Upload", {"name": "x", "profile": huge}, tenant).status_code in (400, 413)
        r = call(c, "Get", {"id": "01J00000000000000000000000-x"}, tenant)
        assert r.status_code == 404
        assert call(c, "List", {}, tenant).json() == {}
