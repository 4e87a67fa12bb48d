"""What the benchmarks share: the machine description, writing results, an HTTP client, a real
``hotspan server`` subprocess, /proc readings, latency statistics and table formatting."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
from typing import (
    Any,
    Callable,
    Collection,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    TypeVar,
)

import httpx

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(BENCH_DIR)
RESULTS_DIR = os.path.join(BENCH_DIR, "results")
AGENT_WORKLOAD_DIR = os.path.join(BENCH_DIR, "agent_workloads")
CLK_TCK = os.sysconf("SC_CLK_TCK")
T = TypeVar("T")

# Said under the machine where load generators and servers ran on it together.
SHARED_CPUS = (
    "Load generators and servers share these CPUs: read the ratios, measured in one run, more "
    "than the absolute numbers."
)

# The profilers and libraries the agent benchmarks compare hotspan with or run under.
AGENT_TOOLS = ("py-spy", "pyroscope-io", "ddtrace", "opentelemetry-sdk", "starlette", "uvicorn")


def log(msg: str) -> None:
    """Progress, on stderr: stdout carries the report."""
    print(msg, file=sys.stderr, flush=True)


# -- the machine -----------------------------------------------------------------------------


def loadavg() -> List[float]:
    """The 1/5/15-minute load average: other work on a shared machine shows up as noise."""
    return [round(x, 2) for x in os.getloadavg()]


def tool_versions(dists: Iterable[str]) -> Dict[str, str]:
    """The installed version of each distribution (``not installed`` where it is absent)."""
    from importlib import metadata

    out = {}
    for dist in dists:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def machine(tools: Sequence[str] = ()) -> Dict[str, object]:
    """CPU, cores, memory, Python, OS, the hotspan commit and tree measured, the server's
    libraries, the versions of ``tools`` (distributions compared) and the load average now."""
    import duckdb
    import numpy
    from google.protobuf import __version__ as pb_version
    from google.protobuf.internal import api_implementation

    cpu_model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = 0.0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
                    break
    except OSError:
        pass
    import hotspan

    src_dir = os.path.dirname(os.path.dirname(os.path.abspath(hotspan.__file__)))
    try:
        commit = subprocess.run(
            ["git", "-C", REPO_DIR, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        dirty = src_dir == os.path.join(REPO_DIR, "src") and bool(
            subprocess.run(
                ["git", "-C", REPO_DIR, "status", "--porcelain", "--", "src"],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.strip()
        )
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "", False
    return {
        "hotspan_src": src_dir,
        "nproc": os.cpu_count(),
        "sched_affinity": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model,
        "mem_gib": mem_gib,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "duckdb": duckdb.__version__,
        "numpy": numpy.__version__,
        "protobuf": f"{pb_version} ({api_implementation.Type()})",
        "git_commit": commit + ("-dirty(src)" if dirty else ""),
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "versions": tool_versions(tools),
        "loadavg": loadavg(),
    }


def machine_text(
    m: Mapping[str, Any],
    versions: Optional[Mapping[str, str]] = None,
    load: Optional[Tuple[Any, Any]] = None,
    note: str = "",
) -> str:
    """The "Machine: ..." line of a report: ``m`` from ``machine()``; ``versions`` of the tools
    compared (default: those ``machine`` read); ``load``, the load average at start and end of
    the run (default: the one ``machine`` read, and the one ``finish_run`` adds); ``note``
    after it."""
    versions = m.get("versions", {}) if versions is None else versions
    libs = [f"duckdb {m.get('duckdb')}", f"numpy {m.get('numpy')}", f"protobuf {m.get('protobuf')}"]
    libs += [f"{k} {v}" for k, v in versions.items()]
    start, end = load if load is not None else (m.get("loadavg"), m.get("loadavg_end"))
    text = (
        f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), {m.get('mem_gib')} GiB RAM, "
        f"Python {m['python']} ({m.get('implementation')}), {m['platform']}; hotspan commit "
        f"{m['git_commit']} (imported from `{m.get('hotspan_src')}`); {', '.join(libs)}; "
        f"{m['date_utc']} UTC. Load average (1/5/15 min) at start {start}"
    )
    text += f", at end {end}." if end is not None else "."
    return text + (f" {note}" if note else "")


# -- command lines and results ---------------------------------------------------------------


def result_name(benchmark: str, quick: bool = False) -> str:
    """``benchmark``, or ``benchmark-quick`` for a ``--quick`` run: a quick run never replaces
    the full run's numbers (``bench/results/.gitignore`` keeps quick results out of git)."""
    return benchmark + ("-quick" if quick else "")


def write_results(
    benchmark: str,
    report: Any,
    md: str,
    out_dir: str = RESULTS_DIR,
    quick: bool = False,
) -> str:
    """``out_dir/<name>.json`` and ``.md`` side by side (``name`` from ``result_name``);
    returns the path without the suffix."""
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, result_name(benchmark, quick))
    with open(stem + ".json", "w") as f:
        json.dump(report, f, indent=1, default=str)
        f.write("\n")
    with open(stem + ".md", "w") as f:
        f.write(md if md.endswith("\n") else md + "\n")
    return stem


def finish_run(
    benchmark: str,
    result: Dict[str, Any],
    report: Dict[str, Any],
    t0: float,
    markdown: Callable[[Dict[str, Any], str, Dict[str, Any], float], str],
    out_dir: str = RESULTS_DIR,
    quick: bool = False,
) -> int:
    """A benchmark's ``result`` with the run's command, machine and wall time (``report``, and
    ``t0`` from ``time.perf_counter``), its Markdown (``markdown(result, command, machine,
    wall_s)``) printed and written beside the JSON (``write_results``)."""
    wall = time.perf_counter() - t0
    report["machine"]["loadavg_end"] = loadavg()
    result.update(command=report["command"], machine=report["machine"], wall_s=round(wall, 1))
    md = markdown(result, str(report["command"]), report["machine"], wall)
    stem = write_results(benchmark, result, md, out_dir, quick)
    print(md)
    log(f"wrote {stem}.md/.json in {wall:.0f} s")
    return 0


def head(title: str, command: str, wall_s: float, machine_line: str) -> List[str]:
    """A report's first lines: title, command and wall time, the machine (``machine_text``)."""
    return [
        f"# {title}",
        "",
        f"Command: `{command}` — total wall time {wall_s:.0f} s.",
        "",
        machine_line,
    ]


def stderr_section(errors: Sequence[str]) -> List[str]:
    """The servers' last stderr lines at the end of a report (nothing when they said none)."""
    if not errors:
        return []
    lines = ["", "Server stderr (last lines):", ""]
    return lines + ["    " + e.replace("\n", "\n    ") for e in errors]


def print_json(result: Any) -> int:
    """A benchmark run on its own without writing results: its result on stdout."""
    print(json.dumps(result, indent=2, default=str))
    return 0


def command_line(script: str) -> str:
    """How this run was started, for a report: ``python bench/<script> <its arguments>``."""
    return f"python bench/{script}" + "".join(f" {a}" for a in sys.argv[1:])


def comma_list(ap: Any, text: str, allowed: Sequence[str], what: str) -> List[str]:
    """The names in a comma-separated option of ``ap`` (an ``argparse.ArgumentParser``); an
    unknown one is a usage error."""
    names = [n for n in text.split(",") if n]
    unknown = set(names) - set(allowed)
    if unknown:
        ap.error(f"unknown {what}(s): {', '.join(sorted(unknown))} (from {', '.join(allowed)})")
    return names


# -- HTTP ------------------------------------------------------------------------------------


class Client:
    """One keep-alive HTTP/1.1 connection to a server at ``url``, as Grafana's data source
    keeps one (a connection the server closed while idle is replaced on the next request).
    Answers are asked for uncompressed by default, so that a time measured is the server's
    answer and not a compression step the clients compared do not ask for; ``accept_encoding``
    None asks as httpx does by default (gzip, as a browser would)."""

    def __init__(
        self, url: str, timeout: float = 300.0, accept_encoding: Optional[str] = "identity"
    ) -> None:
        self.url = url.rstrip("/")
        headers = {} if accept_encoding is None else {"Accept-Encoding": accept_encoding}
        self._http = httpx.Client(
            base_url=self.url, timeout=timeout, trust_env=False, headers=headers
        )

    def request(
        self,
        method: str,
        path: str,
        headers: Optional[Mapping[str, str]] = None,
        body: Optional[bytes] = None,
    ) -> Tuple[int, bytes, float]:
        """Status, body and seconds from sending the request to the last byte read."""
        t0 = time.perf_counter()
        resp = self._http.request(method, path, headers=headers, content=body)
        return resp.status_code, resp.content, time.perf_counter() - t0

    def post(
        self, path: str, body: bytes, headers: Optional[Mapping[str, str]] = None
    ) -> Tuple[int, bytes, float]:
        return self.request("POST", path, headers, body)

    def fetch(
        self,
        what: str,
        method: str,
        path: str,
        headers: Optional[Mapping[str, str]] = None,
        body: Optional[bytes] = None,
    ) -> bytes:
        """The body of a 200 answer; any other status is an error naming ``what``."""
        status, data, _ = self.request(method, path, headers, body)
        if status != 200:
            raise RuntimeError(f"{what}: HTTP {status}: {data[:300]!r}")
        return data

    def call(
        self,
        method: str,
        path: str,
        payload: Any = None,
        headers: Optional[Mapping[str, str]] = None,
    ) -> Tuple[int, Any, float]:
        """``payload`` sent as JSON (when given); status, the answer decoded (JSON, else text)
        and seconds."""
        body = None if payload is None else json.dumps(payload).encode()
        if not headers and body is not None:
            headers = {"Content-Type": "application/json"}
        status, raw, dt = self.request(method, path, headers, body)
        try:
            answer: Any = json.loads(raw) if raw else None
        except ValueError:
            answer = raw.decode("utf-8", "replace")
        return status, answer, dt

    def call_ok(self, method: str, path: str, payload: Any = None) -> Any:
        """``call``'s answer; a status other than 2xx is an error."""
        status, answer, _ = self.call(method, path, payload)
        if not 200 <= status < 300:
            raise RuntimeError(f"{method} {path}: HTTP {status} {str(answer)[:300]}")
        return answer

    def answer_or_none(self, method: str, path: str, payload: Any = None) -> Any:
        """``call_ok``'s answer, or None where the server has no such API (404)."""
        status, answer, _ = self.call(method, path, payload)
        if status == 404:
            return None
        if not 200 <= status < 300:
            raise RuntimeError(f"{method} {path}: HTTP {status} {str(answer)[:300]}")
        return answer

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- profiles read back ---------------------------------------------------------------------


def flamegraph(
    url: str, profile_type: str, selector: str, start_ms: int, end_ms: int, **extra: Any
) -> Dict[str, Any]:
    """The querier's flame graph (``names`` and ``levels``) for one selector and range, as the
    UI asks for it (``SelectMergeStacktraces``, JSON); ``extra`` fields go into the request."""
    request = {
        "profileTypeID": profile_type,
        "labelSelector": selector,
        "start": start_ms,
        "end": end_ms,
        **extra,
    }
    with Client(url, timeout=60) as client:
        doc = client.call_ok("POST", "/querier.v1.QuerierService/SelectMergeStacktraces", request)
    return doc.get("flamegraph", {})


def base_name(name: str) -> str:
    """``func`` from ``func``, ``module.func``, ``Class.func`` or ``func (file.py:12)``."""
    name = name.split(" (", 1)[0]
    return name.rsplit(".", 1)[-1].rsplit(":", 1)[-1]


# The per-function totals' key for the CPU of the stacks that hold any of a run's
# ``work_functions`` (each stack once).
WORK = "<work>"


def add_stack(out: Dict[str, int], names: Set[str], value: int, work: Collection[str]) -> None:
    """One stack's value, to each function on it (once) and to WORK if it holds any of
    ``work``."""
    for name in names:
        out[name] = out.get(name, 0) + value
    if not names.isdisjoint(work):
        out[WORK] = out.get(WORK, 0) + value


def flamegraph_totals(
    graph: Dict[str, Any], work: Collection[str] = ()
) -> Tuple[int, Dict[str, int]]:
    """Total and per-function totals (ns) of a querier flame graph (``names`` + ``levels`` of
    [x offset from the previous node's end, total, self, name index] quadruples); a function
    counted once per node, which is once per stack as long as it does not recurse (the
    workloads' functions do not); WORK: the nodes of ``work`` under no other node of it."""
    names = graph.get("names", [])
    out: Dict[str, int] = {}
    found: List[Tuple[int, int]] = []  # [x, x + total) of the WORK nodes counted
    for level in graph.get("levels", [])[1:]:
        values = [int(v) for v in level.get("values", [])]
        end = 0
        for i in range(0, len(values), 4):
            x, total = end + values[i], values[i + 1]
            end = x + total
            key = base_name(names[values[i + 3]])
            out[key] = out.get(key, 0) + total
            if key in work and not any(lo <= x < hi for lo, hi in found):
                found.append((x, end))
                out[WORK] = out.get(WORK, 0) + total
    return int(graph.get("total", 0) or 0), out


# -- the agent workloads -------------------------------------------------------------------


def calibrate_agent_workload(
    workload: str,
    seconds: float,
    variant: Optional[Dict[str, Any]] = None,
    env: Optional[Dict[str, str]] = None,
) -> Dict[str, Any]:
    """The params of ``bench/agent_workloads/<workload>.py`` for ~``seconds`` of work, for its
    ``variant`` (keyword arguments of its ``calibrate``; the default variant when None)."""
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(AGENT_WORKLOAD_DIR, f"{workload}.py"),
            "--calibrate",
            str(seconds),
            "--params",
            json.dumps(variant or {}),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_DIR,
        env=env,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def workload_python() -> str:
    """The interpreter the agent's workloads run on (see :func:`workload_command`)."""
    return os.environ.get("HOTSPAN_BENCH_PYTHON") or sys.executable


def compile_hotspan(python: str, env: Optional[Mapping[str, str]] = None) -> str:
    """Writes the bytecode of the hotspan that ``python`` imports (with ``env``), as pip does as
    it installs a package, and returns where that hotspan is.  Without it, a workload whose
    environment has no bytecode for its interpreter (``PYTHONDONTWRITEBYTECODE``, a fresh
    interpreter) compiles the agent at every start: measured on 3.13t, 3 MiB more peak RSS (the
    parser's memory stays in the process), charged to the agent as no installed copy costs."""
    run_env = dict(os.environ if env is None else env)
    where = subprocess.run(
        [python, "-c", "import hotspan, os; print(os.path.dirname(hotspan.__file__))"],
        env=run_env,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    if where:
        run_env.pop("PYTHONDONTWRITEBYTECODE", None)
        subprocess.run(
            [python, "-m", "compileall", "-q", where],
            env=run_env,
            capture_output=True,
            timeout=300,
        )
    return where


def workload_command(
    workload: str,
    profiler: str,
    app: str,
    server_url: str,
    params: Mapping[str, Any],
    python_flags: Sequence[str] = (),
) -> List[str]:
    """The command line of one ``bench/agent_workloads/<workload>.py`` run under ``profiler``,
    uploading to ``server_url`` as ``app``; on ``HOTSPAN_BENCH_PYTHON`` where it is set (another
    interpreter than the bench's, whose server runs on this one: a free-threaded build)."""
    return [
        workload_python(),
        *python_flags,
        os.path.join(AGENT_WORKLOAD_DIR, f"{workload}.py"),
        "--profiler",
        profiler,
        "--app",
        app,
        "--server",
        server_url,
        "--params",
        json.dumps(params),
    ]


# -- /proc ---------------------------------------------------------------------------------


def proc_status(pid: int) -> Dict[str, int]:
    """VmRSS / VmHWM in bytes."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, value = line.split(":", 1)
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def _stat_cpu(path: str) -> float:
    with open(path) as f:
        data = f.read()
    fields = data[data.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a process (all threads)."""
    try:
        return _stat_cpu(f"/proc/{pid}/stat")
    except (OSError, ValueError):
        return 0.0


def thread_cpu(pid: int) -> Dict[int, float]:
    """CPU seconds per thread id (the main thread's id is the pid)."""
    return {tid: cpu for tid, (_, cpu) in thread_times(pid).items()}


def thread_times(pid: int) -> Dict[int, Tuple[str, float]]:
    """OS name and CPU seconds of every thread of ``pid``."""
    out: Dict[int, Tuple[str, float]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        with contextlib.suppress(OSError, ValueError):  # the thread may have exited
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
            out[int(tid)] = (comm, _stat_cpu(f"/proc/{pid}/task/{tid}/stat"))
    return out


class CpuWindow:
    """CPU seconds of a process between ``start()`` and ``stop()``, main thread vs others."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._t0 = 0.0
        self._threads0: Dict[int, float] = {}
        self._total0 = 0.0

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._threads0 = thread_cpu(self.pid)
        self._total0 = proc_cpu(self.pid)

    def stop(self) -> Dict[str, object]:
        wall = time.perf_counter() - self._t0
        named = thread_times(self.pid)
        threads = {tid: cpu for tid, (_, cpu) in named.items()}
        by_name: Dict[str, float] = {}
        for tid, (comm, cpu) in named.items():
            key = "main" if tid == self.pid else comm
            by_name[key] = by_name.get(key, 0.0) + cpu - self._threads0.get(tid, 0.0)
        total = proc_cpu(self.pid) - self._total0
        main = threads.get(self.pid, 0.0) - self._threads0.get(self.pid, 0.0)
        others = {
            tid: cpu - self._threads0.get(tid, 0.0)
            for tid, cpu in threads.items()
            if tid != self.pid
        }
        busiest = sorted(others.values(), reverse=True)
        return {
            "wall_s": round(wall, 3),
            "cpu_s": round(total, 2),
            "cpu_per_wall": round(total / wall, 3) if wall else 0.0,
            "main_thread_cpu_s": round(main, 2),
            "other_threads_cpu_s": round(sum(others.values()), 2),
            "busiest_other_thread_cpu_s": round(busiest[0], 2) if busiest else 0.0,
            "threads": len(threads),
            "by_thread_name": {k: round(v, 2) for k, v in sorted(by_name.items())},
        }


class RssSampler(threading.Thread):
    """The peak of a process's ``field`` (VmRSS, or VmHWM for a process that is not ours to
    ``getrusage``), read from /proc every ``interval`` seconds until ``stop()``."""

    def __init__(self, pid: int, interval: float = 0.25, field: str = "VmRSS") -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval = interval
        self.field = field
        self.peak = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            rss = proc_status(self.pid).get(self.field, 0)
            self.peak = max(self.peak, rss)
            self._stop_event.wait(self.interval)

    def stop(self) -> int:
        self._stop_event.set()
        self.join(2)
        return self.peak


# -- the server ----------------------------------------------------------------------------

_LISTENING = re.compile(r"listening on http://(\S+):(\d+)")
# Printed before the "listening on" line by servers that have OTLP receivers.
_OTLP_HTTP = re.compile(r"OTLP/HTTP on http://(\S+):(\d+)")
_OTLP_GRPC = re.compile(r"OTLP/gRPC on (\S+):(\d+)")
_server_flags: Optional[str] = None


def _server_help() -> str:
    """``hotspan server --help`` (once): tells which options the measured version has."""
    global _server_flags
    if _server_flags is None:
        _server_flags = subprocess.run(
            [sys.executable, "-m", "hotspan", "server", "--help"],
            capture_output=True,
            text=True,
            cwd=REPO_DIR,
            timeout=60,
        ).stdout
    return _server_flags


def default_server_args() -> List[str]:
    """OTLP receivers on free ports (not 4317/4318, which something else may hold) and no
    retention (the cached data sets have fixed, old timestamps), where the server has them."""
    flags = _server_help()
    args: List[str] = []
    if "--otlp-http-port" in flags:
        args += ["--otlp-http-port", "0"]
    if "--otlp-grpc-port" in flags:
        args += ["--otlp-grpc-port", "0"]
    if re.search(r"--retention[\s\]]", flags):
        args += ["--retention", "0"]
    return args


class Server:
    """``hotspan server --port 0 --data-dir DIR`` as a child process, with the OTLP receivers
    on free ports and retention off (``default_server_args``; ``extra_args`` come after them
    and win)."""

    def __init__(self, data_dir: str, extra_args: Optional[List[str]] = None) -> None:
        self.data_dir = data_dir
        self.extra_args = extra_args or []
        self.proc: Optional[subprocess.Popen] = None
        self.host = "127.0.0.1"
        self.port = 0
        self.otlp_http: Optional[Tuple[str, int]] = None  # (host, port)
        self.otlp_grpc: Optional[Tuple[str, int]] = None
        self.startup_s = 0.0
        self._stderr_tail: List[str] = []

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 120.0) -> Server:
        t0 = time.perf_counter()
        cmd = [
            sys.executable,
            "-m",
            "hotspan",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--data-dir",
            self.data_dir,
            *default_server_args(),
            *self.extra_args,
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO_DIR,
        )
        # stderr is drained by a thread so that warnings cannot fill the pipe and block it.
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        deadline = time.time() + timeout
        assert self.proc.stdout is not None
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        "hotspan server exited during startup:\n" + "".join(self._stderr_tail)
                    )
                continue
            for pattern, attr in ((_OTLP_HTTP, "otlp_http"), (_OTLP_GRPC, "otlp_grpc")):
                m = pattern.search(line)
                if m:
                    setattr(self, attr, (m.group(1).strip("[]"), int(m.group(2))))
            m = _LISTENING.search(line)
            if m:
                self.host, self.port = m.group(1), int(m.group(2))
                break
        else:
            self.stop()
            raise RuntimeError("hotspan server did not print its address in time")
        threading.Thread(target=self._drain_stdout, daemon=True).start()
        self._wait_ready(deadline)
        self.startup_s = time.perf_counter() - t0
        return self

    def _wait_ready(self, deadline: float) -> None:
        with Client(self.url, timeout=5) as client:
            while time.time() < deadline:
                with contextlib.suppress(httpx.TransportError):
                    if client.request("GET", "/ready")[0] == 200:
                        return
                time.sleep(0.05)
        raise RuntimeError("hotspan server never became ready")

    def _drain_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for _ in self.proc.stdout:
            pass

    def _drain_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr_tail.append(line)
            del self._stderr_tail[:-50]

    def memory(self) -> Dict[str, int]:
        return proc_status(self.pid)

    def stop(self, timeout: float = 60.0) -> Dict[str, object]:
        """SIGTERM (graceful: the store commits and closes); returns exit code and time taken."""
        if self.proc is None or self.proc.poll() is not None:
            return {"returncode": self.proc.returncode if self.proc else None}
        t0 = time.perf_counter()
        self.proc.terminate()
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        return {"returncode": rc, "shutdown_s": round(time.perf_counter() - t0, 2)}

    def stderr_tail(self) -> str:
        return "".join(self._stderr_tail[-20:])

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc) -> None:  # type: ignore[no-untyped-def]
        self.stop()


# -- statistics ----------------------------------------------------------------------------


def percentile(values: List[float], p: float) -> float:
    """Nearest-rank-free linear interpolation percentile (p in 0..100)."""
    if not values:
        return float("nan")
    data = sorted(values)
    if len(data) == 1:
        return data[0]
    pos = (len(data) - 1) * p / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def latency_summary(seconds: List[float]) -> Dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {
        "runs": len(ms),
        "median_ms": round(statistics.median(ms), 2) if ms else float("nan"),
        "p90_ms": round(percentile(ms, 90), 2),
        "min_ms": round(min(ms), 2) if ms else float("nan"),
        "max_ms": round(max(ms), 2) if ms else float("nan"),
    }


def repeat_timed(
    fn: Callable[[int], T],
    warmups: int,
    runs: int,
    on_timed_start: Optional[Callable[[], None]] = None,
) -> Tuple[T, float, List[float]]:
    """``fn(i)`` for ``warmups`` warm-up calls then ``runs`` timed ones: the first call's
    result and seconds (the cold call, reported on its own) and the timed calls' seconds;
    ``on_timed_start`` runs just before the first timed call."""
    first: Optional[Tuple[T, float]] = None
    times: List[float] = []
    for i in range(warmups + runs):
        if i == warmups and on_timed_start is not None:
            on_timed_start()
        t0 = time.perf_counter()
        result = fn(i)
        dt = time.perf_counter() - t0
        if i == 0:
            first = (result, dt)
        elif i >= warmups:
            times.append(dt)
    assert first is not None, "no call made"
    return first[0], first[1], times


def first_and_median(fn: Callable[[], T], repeat: int) -> Tuple[T, float, float]:
    """(result, first call's seconds, median of the ``repeat`` calls after it; the first call's
    seconds when there are none)."""
    result, first, times = repeat_timed(lambda _: fn(), 1, repeat)
    return result, first, statistics.median(times) if times else first


def median_or_none(values: Iterable[Optional[float]]) -> Optional[float]:
    """The median of the values that are not None; None when there are none."""
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def fmt_opt(v: Optional[float], digits: int = 1, sign: bool = False) -> str:
    """A value for a table, ``–`` where there is none."""
    if v is None:
        return "–"
    return f"{v:+.{digits}f}" if sign else f"{v:.{digits}f}"


def mib(n: float) -> float:
    return round(n / (1024 * 1024), 1)


def fmt_number(n: object) -> str:
    """A number for a results table: thousands separators, one or two decimals for floats."""
    if isinstance(n, float):
        return f"{n:,.1f}" if n >= 100 else f"{n:,.2f}"
    if isinstance(n, int):
        return f"{n:,}"
    return str(n)


class LoadMemory:
    """A server's RSS around a load: read before it (the sampler starts first), sampled
    during it, and read at its end, just before ``stop_server``."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.sampler = RssSampler(server.pid)
        self.sampler.start()
        self.before = server.memory().get("VmRSS", 0)

    def stop_server(self) -> Dict[str, object]:
        """Stops the server (gracefully); its RSS before, at the end and at peak, and how
        its stop went."""
        mem = self.server.memory()
        peak = self.sampler.stop()
        stop = self.server.stop()
        return {
            "server_rss_before_mib": mib(self.before),
            "server_rss_end_mib": mib(mem.get("VmRSS", 0)),
            "server_peak_rss_mib": mib(max(mem.get("VmHWM", 0), peak)),
            "server_stop": stop,
        }


@contextlib.contextmanager
def measured_server(
    data_dir: str, extra_args: Optional[List[str]] = None
) -> Iterator[Tuple[Server, Dict[str, object]]]:
    """A started server (``extra_args`` as ``Server`` takes them) and the dict its start-up,
    RSS, peak RSS and stop are recorded in."""
    server = Server(data_dir, extra_args).start()
    out: Dict[str, object] = {
        "server_startup_s": round(server.startup_s, 2),
        "server_rss_after_start_mib": mib(server.memory().get("VmRSS", 0)),
    }
    sampler = RssSampler(server.pid, 0.1)
    sampler.start()
    try:
        yield server, out
        mem = server.memory()
        out["server_rss_end_mib"] = mib(mem.get("VmRSS", 0))
        out["server_peak_rss_mib"] = mib(max(mem.get("VmHWM", 0), sampler.stop()))
    finally:
        sampler.stop()
        out["server_stop"] = server.stop()
        out["server_stderr"] = server.stderr_tail()[-2000:]


DATA_MARKER = "bench-params.json"


def mark_data(data_dir: str, params: Dict[str, Any], **info: Any) -> None:
    """Record that ``data_dir`` is a finished build of ``params`` (with ``info``), for
    ``cached_data`` to find."""
    with open(os.path.join(data_dir, DATA_MARKER), "w") as f:
        json.dump({"params": params, **info}, f, indent=2)


def stored_rows(data_dir: str, *queries: str) -> List[Tuple[Any, ...]]:
    """The first row of each query on a server's DuckDB file in ``data_dir``, read after the
    server has shut down (what it committed)."""
    import duckdb

    con = duckdb.connect(os.path.join(data_dir, "hotspan.duckdb"), read_only=True)
    try:
        return [con.execute(sql).fetchone() for sql in queries]
    finally:
        con.close()


def stored_samples(data_dir: str) -> Tuple[int, int]:
    """(sample rows, the sum of their values) a server stored in ``data_dir``."""
    ((rows, total),) = stored_rows(
        data_dir, "SELECT count(*), coalesce(sum(value), 0)::BIGINT FROM samples"
    )
    return int(rows), int(total)


def dir_mib(path: str) -> float:
    """The size of the files directly in ``path``, MiB."""
    return mib(sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)))


def cached_data(data_dir: str, params: Dict[str, int], rebuild: bool) -> Optional[dict]:
    """What a finished build of ``data_dir`` recorded, if it was built with ``params``."""
    marker = os.path.join(data_dir, DATA_MARKER)
    if rebuild or not os.path.exists(marker):
        return None
    with open(marker) as f:
        saved = json.load(f)
    return saved if saved.get("params") == params else None
