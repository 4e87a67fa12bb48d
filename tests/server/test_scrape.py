"""``hotspan server --scrape``: a real server pulls a Python program's and a Go program's
/debug/pprof endpoints and stores them under the configured labels."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, Tuple

import httpx
import pytest

from hotspan.formats.pprof import read_stack_profile
from hotspan.formats.proto import querier_pb2
from hotspan.model.stack_profile import function_values
from tests.agent.test_pull import TARGET, free_port, get, start_program, stop_program
from tests.conftest import RunningServer, running_server
from tests.helpers import GO, go_env

QUERIER = "/querier.v1.QuerierService"
CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
ALLOC_SPACE = "memory:alloc_space:bytes:space:bytes"
INUSE_SPACE = "memory:inuse_space:bytes:space:bytes"
MUTEX_DELAY = "mutex:delay:nanoseconds:contentions:count"
GOROUTINES = "goroutines:goroutine:count:goroutine:count"

GO_PROGRAM = textwrap.dedent(
    """
    package main

    import (
        "fmt"
        "net/http"
        _ "net/http/pprof"
        "os"
        "runtime"
    )

    var sink [][]byte

    //go:noinline
    func burnCPU() {
        x := 0
        for {
            for i := 0; i < 1000000; i++ {
                x += i % 7
            }
            if x == -1 {
                fmt.Println(x)
            }
        }
    }

    //go:noinline
    func allocBurst() {
        for i := 0; i < 100; i++ {
            sink = append(sink, make([]byte, 65536))
        }
        sink = nil
    }

    func main() {
        runtime.MemProfileRate = 1
        runtime.SetMutexProfileFraction(1)
        go burnCPU()
        http.HandleFunc("/alloc", func(w http.ResponseWriter, r *http.Request) {
            allocBurst()
            // The heap profile is as of the last GC, and may lag one more.
            runtime.GC()
            runtime.GC()
            fmt.Fprintln(w, "ok")
        })
        fmt.Println("READY")
        if err := http.ListenAndServe("127.0.0.1:"+os.Args[1], nil); err != nil {
            panic(err)
        }
    }
    """
)


def write_config(tmp: Path, targets: Dict[str, str], extra: str = "") -> Path:
    jobs = "".join(
        f"""
  - job_name: {job}
    static_configs:
      - targets: ["{address}"]
        labels: {{env: scrape-test}}
"""
        for job, address in targets.items()
    )
    path = tmp / "scrape.yaml"
    path.write_text(f"scrape_interval: 2s\nscrape_timeout: 5s\n{extra}scrape_configs:{jobs}")
    return path


def merged(
    client: httpx.Client, type_id: str, selector: str, start_ms: int = 1
) -> Dict[str, Tuple[int, int]]:
    """{function: (self, total)} of everything stored under ``selector`` since start_ms."""
    req = querier_pb2.SelectMergeProfileRequest(
        profile_typeID=type_id,
        label_selector=selector,
        start=start_ms,
        end=int(time.time() * 1000) + 60_000,
    )
    resp = client.post(
        f"{QUERIER}/SelectMergeProfile",
        content=req.SerializeToString(),
        headers={"content-type": "application/proto"},
    )
    assert resp.status_code == 200, resp.text
    if not resp.content:
        return {}
    profile = read_stack_profile(resp.content)
    if not profile.stacks:
        return {}
    return {n: (v.self_value, v.total_value) for n, v in function_values(profile).items()}


def wait_for(check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    assert check()


def answers(url: str) -> bool:
    try:
        return get(url, timeout=2)[0] == 200
    except OSError:  # not listening yet
        return False


def targets_state(srv: RunningServer) -> Dict[Tuple[str, str], dict]:
    with srv.client() as c:
        body = c.get("/api/v1/scrape/targets").json()
    return {(t["job"], t["profile"]): t for t in body["targets"]}


@pytest.fixture(scope="module")
def go_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    if GO is None:
        pytest.skip("`go` is not on PATH (the Go target is built with it)")
    tmp = tmp_path_factory.mktemp("gotarget")
    (tmp / "main.go").write_text(GO_PROGRAM)
    built = subprocess.run(
        [GO, "build", "-o", str(tmp / "target"), str(tmp / "main.go")],
        capture_output=True,
        text=True,
        env=go_env(tmp),
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    port = free_port()
    proc = subprocess.Popen([str(tmp / "target"), str(port)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
    wait_for(lambda: answers(f"http://127.0.0.1:{port}/debug/pprof/"), 10)
    try:
        yield port
    finally:
        proc.kill()
        proc.wait()


def test_python_target_stored_under_its_labels_beside_a_down_target(tmp_path: Path) -> None:
    proc, port = start_program(tmp_path, "target", TARGET)
    dead = free_port()  # nothing listens there
    cfg = write_config(tmp_path, {"pyapp": f"127.0.0.1:{port}", "gone": f"127.0.0.1:{dead}"})
    try:
        with running_server(tmp_path / "data", ["--scrape", str(cfg)]) as srv:
            selector = f'{{service_name="pyapp", env="scrape-test", instance="127.0.0.1:{port}"}}'
            with srv.client() as c:
                wait_for(lambda: "__main__.burn_cpu_known" in merged(c, CPU, selector))
                cpu = merged(c, CPU, selector)
                top = max(cpu, key=lambda n: cpu[n][0])
                assert top == "__main__.burn_cpu_known", cpu
                wait_for(lambda: "__main__.allocate_known" in merged(c, ALLOC_SPACE, selector))
                for type_id, function in (
                    (INUSE_SPACE, "__main__.allocate_known"),
                    (MUTEX_DELAY, "__main__.contend_known"),
                    (GOROUTINES, "__main__.wait_known"),
                ):
                    wait_for(lambda t=type_id, f=function: f in merged(c, t, selector))
                job = merged(c, CPU, '{job="pyapp"}')
                assert "__main__.burn_cpu_known" in job
            state = targets_state(srv)
            assert state[("pyapp", "cpu")]["health"] == "up"
            assert state[("pyapp", "cpu")]["last_scrape"] > 0
            gone = state[("gone", "cpu")]
            assert gone["health"] == "down" and gone["failures"] >= 1
            assert "connect" in gone["last_error"], gone
            srv.stop()
            log = srv.process.stdout.read()  # type: ignore[union-attr]
        # The target that is down is one line, not one a profile and interval.
        assert log.count(f"127.0.0.1:{dead}") == 1, log
    finally:
        stop_program(proc)


def test_go_target_scraped_and_allocs_stored_as_deltas(tmp_path: Path, go_target: int) -> None:
    cfg = write_config(tmp_path, {"goapp": f"127.0.0.1:{go_target}"})
    selector = '{service_name="goapp"}'
    with running_server(tmp_path / "data", ["--scrape", str(cfg)]) as srv, srv.client() as c:
        wait_for(lambda: "main.burnCPU" in merged(c, CPU, selector))
        wait_for(lambda: targets_state(srv)[("goapp", "allocs")]["scrapes"] >= 2)
        # One burst of exactly 100 x 64 KiB, then several scrapes: stored once.
        assert get(f"http://127.0.0.1:{go_target}/alloc")[0] == 200
        wait_for(lambda: "main.allocBurst" in merged(c, ALLOC_SPACE, selector))
        scrapes = targets_state(srv)[("goapp", "allocs")]["scrapes"]
        wait_for(lambda: targets_state(srv)[("goapp", "allocs")]["scrapes"] >= scrapes + 2, 20)
        total = merged(c, ALLOC_SPACE, selector)["main.allocBurst"][1]
        # The 100 buffers, plus the few KiB of the slice of them growing; twice (one per
        # scrape since) would be 13 MB.
        assert 100 * 65536 <= total < 101 * 65536, total
        assert GOROUTINES in {t["ID"] for t in profile_types(c)}
        state = targets_state(srv)
        assert all(state[("goapp", p)]["health"] == "up" for p in ("cpu", "heap", "mutex"))


def profile_types(client: httpx.Client) -> list:
    resp = client.post(
        f"{QUERIER}/ProfileTypes", content=b"{}", headers={"content-type": "application/json"}
    )
    return json.loads(resp.content)["profileTypes"]


@pytest.mark.parametrize(
    "text, words",
    [
        ("scrape_configs: []\n", "non-empty list"),
        (
            "scrape_configs:\n  - job_name: api\n    profiles: [cpux]\n"
            "    static_configs: [{targets: ['127.0.0.1:1']}]\n",
            "job 'api': unknown profile 'cpux'",
        ),
        (
            "scrape_configs:\n  - job_name: api\n    static_configs: [{targets: ['nohost']}]\n",
            "job 'api': target 'nohost' is not host:port",
        ),
        (
            "scrape_interval: soon\nscrape_configs:\n  - job_name: a\n"
            "    static_configs: [{targets: ['h:1']}]\n",
            "scrape_interval 'soon'",
        ),
        ("scrape_configs: [\n", "not YAML"),
    ],
)
def test_bad_config_stops_the_server(tmp_path: Path, text: str, words: str) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "hotspan", "server", "--port", "0", "--scrape", str(cfg)]
        + ["--data-dir", str(tmp_path / "data"), "--otlp-http-port", "off"]
        + ["--otlp-grpc-port", "off"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert str(cfg) in done.stderr and words in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
