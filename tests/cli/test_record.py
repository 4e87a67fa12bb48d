"""``hotspan record``: real programs profiled by the real agent into files, no server; the
files read back by hotspan's own readers and by ``go tool pprof``."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

from hotspan.formats.pprof import read_stack_profile
from hotspan.model.stack_profile import StackProfile, function_values

# A CPU-burning function, an allocating one and a lock two threads contend for.
PROGRAM = textwrap.dedent(
    """
    import os, sys, threading, time

    def burn_cpu_for_record(seconds):
        end = time.process_time() + seconds
        n = 0
        while time.process_time() < end:
            n += 1
        return n

    def allocate_for_record(rounds):
        keep = []
        for _ in range(rounds):
            keep.append([bytearray(1000) for _ in range(1000)])
            if len(keep) > 20:
                keep.pop(0)
        return len(keep)

    lock = threading.Lock()

    def hold_lock_for_record():
        with lock:
            time.sleep(0.4)

    def wait_for_lock_for_record():
        holder = threading.Thread(target=hold_lock_for_record)
        holder.start()
        time.sleep(0.05)
        with lock:
            pass
        holder.join()

    burn_cpu_for_record(float(os.environ.get("BURN_SECONDS", "0.8")))
    allocate_for_record(200)
    wait_for_lock_for_record()
    open(os.environ["RAN_MARKER"], "w").close() if os.environ.get("RAN_MARKER") else None
    sys.exit(int(os.environ.get("EXIT_CODE", "0")))
    """
)


@pytest.fixture
def silent_server() -> Iterator[socket.socket]:
    """A listening socket that nothing should ever connect to."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    try:
        yield sock
    finally:
        sock.close()


def connections(sock: socket.socket) -> int:
    count = 0
    while True:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


def record(
    args: List[str], cwd: Path, env: Optional[Dict[str, str]] = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HOTSPAN_", "PYROSCOPE_", "OTEL_")) or k == "HOTSPAN_TEST"
    }
    base.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "hotspan", "record", *args],
        cwd=cwd,
        env=base,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def program(tmp_path: Path) -> Path:
    path = tmp_path / "prog.py"
    path.write_text(PROGRAM)
    return path


def functions(profile: StackProfile, sample_type: str) -> Dict[str, int]:
    return {
        name: fv.total_value
        for name, fv in function_values(profile, profile.select(sample_type)).items()
    }


def top(values: Dict[str, int]) -> str:
    return max(values, key=lambda name: values[name])


def test_record_every_type_with_no_server(
    tmp_path: Path, program: Path, silent_server: socket.socket
) -> None:
    address = f"http://127.0.0.1:{silent_server.getsockname()[1]}"
    out = tmp_path / "profile.pb.gz"
    started = time.monotonic()
    result = record(
        ["-o", str(out), "--", "python", str(program)],
        tmp_path,
        # Every way a server could be named: none of them may be used.
        env={
            "HOTSPAN_SERVER": address,
            "HOTSPAN_SERVER_ADDRESS": address,
            "PYROSCOPE_SERVER_ADDRESS": address,
        },
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert connections(silent_server) == 0
    assert elapsed < 15, elapsed  # no upload waited on
    (summary,) = [line for line in result.stderr.splitlines() if line.startswith("hotspan")]
    assert summary.startswith(f"hotspan record: wrote {out} (pprof, "), summary
    assert "cpu samples" in summary and "inuse_space" in summary and "delay" in summary
    assert "\x1b" not in result.stderr  # piped: no colours, no progress bar

    profile = read_stack_profile(out.read_bytes())
    types = [st.type for st in profile.sample_types]
    assert types[:2] == ["cpu", "wall"]  # CPU first: the default
    assert set(types) >= {"alloc_space", "alloc_objects", "inuse_space", "contentions", "delay"}
    assert set(types) >= {"goroutine"}
    assert top(functions(profile, "cpu")) == "__main__.<module>"
    cpu = functions(profile, "cpu")
    assert cpu["__main__.burn_cpu_for_record"] >= 0.5 * 0.8e9, cpu
    alloc = functions(profile, "alloc_space")
    assert alloc.get("__main__.allocate_for_record", 0) >= 100e6, alloc  # 200 MB allocated
    delay = functions(profile, "delay")
    assert delay.get("__main__.wait_for_lock_for_record", 0) >= 0.2e9, delay
    wall = functions(profile, "wall")
    assert wall.get("__main__.hold_lock_for_record", 0) >= 0.3e9, wall

    # Go's own reader takes it, every sample type selectable.
    go = shutil.which("go")
    if go is None:
        pytest.skip("no go toolchain")
    for index, expected in (("cpu", "burn_cpu_for_record"), ("delay", "wait_for_lock")):
        pprof = subprocess.run(
            [go, "tool", "pprof", "-top", f"-sample_index={index}", str(out)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert pprof.returncode == 0, pprof.stderr
        assert expected in pprof.stdout, pprof.stdout


def test_module_form_and_exit_code(tmp_path: Path, program: Path) -> None:
    package = tmp_path / "jobs"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "nightly.py").write_text(PROGRAM)
    out = tmp_path / "nightly.pb.gz"
    result = record(
        ["-o", str(out), "--types", "cpu,wall", "-m", "jobs.nightly", "ignored-arg"],
        tmp_path,
        env={"EXIT_CODE": "3", "BURN_SECONDS": "0.4"},
    )
    assert result.returncode == 3, result.stderr
    assert "exit code 3" in result.stderr
    profile = read_stack_profile(out.read_bytes())
    # As --types said; the GIL profiles come with wall time where a thread waited for it (the
    # program's lock-holding thread here).
    types = [st.type for st in profile.sample_types]
    assert types[:2] == ["cpu", "wall"] and set(types[2:]) <= {"gil_wait", "gil_held"}, types
    assert "__main__.burn_cpu_for_record" in functions(profile, "cpu")


def test_python_children_are_recorded(tmp_path: Path) -> None:
    parent = tmp_path / "parent.py"
    parent.write_text(
        textwrap.dedent(
            """
            import subprocess, sys
            child = (
                "import time\\n"
                "def child_burn():\\n"
                "    end = time.process_time() + 0.5\\n"
                "    while time.process_time() < end: pass\\n"
                "child_burn()\\n"
            )
            sys.exit(subprocess.run([sys.executable, "-c", child]).returncode)
            """
        )
    )
    out = tmp_path / "tree.pb.gz"
    result = record(["-o", str(out), str(parent)], tmp_path)
    assert result.returncode == 0, result.stderr
    cpu = functions(read_stack_profile(out.read_bytes()), "cpu")
    assert cpu.get("child_burn", 0) >= 0.25e9, cpu


def test_live_heap_is_a_peak_not_a_sum(tmp_path: Path) -> None:
    """The live heap is a snapshot per window: 20 MB held over many windows is 20 MB, not
    20 MB per window, and not the little left at exit."""
    holder = tmp_path / "holder.py"
    holder.write_text(
        textwrap.dedent(
            """
            import time
            def hold_for_record():
                held = [bytearray(10_000) for _ in range(2_000)]  # 20 MB
                time.sleep(1.5)
                return len(held)
            hold_for_record()
            time.sleep(0.4)  # freed: the heap at exit is small
            """
        )
    )
    out = tmp_path / "heap.pb.gz"
    result = record(
        ["-o", str(out), "--upload-interval", "0.2", "--types", "alloc", str(holder)], tmp_path
    )
    assert result.returncode == 0, result.stderr
    profile = read_stack_profile(out.read_bytes())
    held = functions(profile, "inuse_space").get("__main__.hold_for_record", 0)
    assert 10e6 <= held <= 40e6, held
    assert functions(profile, "alloc_space")["__main__.hold_for_record"] >= 10e6


def test_tag_wrapper_frames_are_left_out(tmp_path: Path) -> None:
    tagged = tmp_path / "tagged.py"
    tagged.write_text(
        textwrap.dedent(
            """
            import time, hotspan

            @hotspan.tag_wrapper({"stage": "parse"})
            def parse_for_record():
                end = time.process_time() + 0.5
                while time.process_time() < end:
                    pass

            with hotspan.tag_wrapper({"stage": "all"}):
                parse_for_record()
            """
        )
    )
    out = tmp_path / "tagged.folded"
    result = record(["-o", str(out), str(tagged)], tmp_path)
    assert result.returncode == 0, result.stderr
    lines = out.read_text().splitlines()
    assert lines
    stacks = [line.rsplit(" ", 1)[0] for line in lines]
    assert "__main__.<module>;__main__.parse_for_record" in stacks, stacks
    # A lone "hotspan" stack is hotspan's own start and exit in the main thread, named so on
    # purpose (agent.symbols.AGENT): a busy machine stretches them enough to be sampled.
    # The wrapper's frames must never show inside the program's stacks.
    program_stacks = [s for s in stacks if s != "hotspan"]
    assert not [s for s in program_stacks if "hotspan" in s or "tag_wrapper" in s], stacks


# Shorter than the agent's first tick: no sample is pinned before CPython frees the script's
# code, as its last line has run, before any exit handler.
SHORT_PROGRAM = textwrap.dedent(
    """
    import sys, time
    assert sys.getprofile() is None  # the agent's watch for this module has gone
    end = time.process_time() + 0.07
    while time.process_time() < end:
        pass
    """
)


@pytest.mark.parametrize("form", ["script", "-m", "-c"])
def test_a_program_shorter_than_a_tick_keeps_its_root(tmp_path: Path, form: str) -> None:
    if form == "-c":
        target = ["--", sys.executable, "-c", SHORT_PROGRAM]
    elif form == "-m":
        (tmp_path / "jobs").mkdir()
        (tmp_path / "jobs" / "__init__.py").write_text("")
        (tmp_path / "jobs" / "short.py").write_text(SHORT_PROGRAM)
        target = ["-m", "jobs.short"]
    else:
        (tmp_path / "short.py").write_text(SHORT_PROGRAM)
        target = [str(tmp_path / "short.py")]
    out = tmp_path / "short.folded"
    result = record(["-o", str(out), "--types", "cpu", *target], tmp_path)
    assert result.returncode == 0, result.stderr
    stacks = [line.rsplit(" ", 1)[0] for line in out.read_text().splitlines()]
    program = [s for s in stacks if s != "hotspan"]
    assert program, stacks
    module = "<module>" if form == "-c" else "__main__.<module>"
    assert all(s.split(";")[-1] == module for s in program), stacks


def test_text_formats(tmp_path: Path, program: Path) -> None:
    env = {"BURN_SECONDS": "0.4"}
    folded = tmp_path / "p.folded"
    result = record(["-o", str(folded), "--profile-type", "wall", str(program)], tmp_path, env)
    assert result.returncode == 0, result.stderr
    assert "(folded," in result.stderr and "wall" in result.stderr
    lines = folded.read_text().splitlines()
    # The wall type: the thread that held the lock sleeping is there (no CPU at all).
    assert any("hold_lock_for_record" in line for line in lines), lines

    # Without --profile-type a one-type file holds the first type recorded, as --help says
    # (and as the pprof's default type): wall here, not the live heap listed last.
    first = tmp_path / "first.folded"
    result = record(["-o", str(first), "--types", "wall,alloc", str(program)], tmp_path, env)
    assert result.returncode == 0, result.stderr
    assert "(folded," in result.stderr and "; wall " in result.stderr, result.stderr
    assert any("hold_lock_for_record" in line for line in first.read_text().splitlines())

    speedscope = tmp_path / "p.speedscope.json"
    result = record(["-o", str(speedscope), str(program)], tmp_path, env)
    assert result.returncode == 0, result.stderr
    document = json.loads(speedscope.read_text())
    assert "speedscope" in document["$schema"]
    names = [frame["name"] for frame in document["shared"]["frames"]]
    assert "__main__.burn_cpu_for_record" in names

    html = tmp_path / "p.out"
    result = record(["-o", str(html), "--format", "html", str(program)], tmp_path, env)
    assert result.returncode == 0, result.stderr
    page = html.read_text()
    assert page.lstrip().lower().startswith("<!doctype html")
    assert "burn_cpu_for_record" in page


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--", "python", "PROGRAM"], "-o/--output"),
        (["-o", "OUT.pb.gz"], "nothing to run"),
        (["-o", "OUT.pb.gz", "--format", "xml", "PROGRAM"], "invalid choice: 'xml'"),
        (["-o", "OUT.xyz", "PROGRAM"], "cannot tell the format"),
        (["-o", "OUT.pb.gz", "--types", "cpu,gpu", "PROGRAM"], "unknown profile type(s) gpu"),
        (["-o", "OUT.pb.gz", "--profile-type", "heap", "PROGRAM"], "unknown profile type"),
        (
            ["-o", "OUT.folded", "--types", "cpu", "--profile-type", "alloc_space", "PROGRAM"],
            "needs the alloc profile",
        ),
        (["-o", "NODIR/out.pb.gz", "PROGRAM"], "no directory"),
        (["-o", "OUT.pb.gz", "--sample-rate", "5000", "PROGRAM"], "sample_rate"),
    ],
)
def test_bad_arguments(tmp_path: Path, program: Path, args: List[str], message: str) -> None:
    marker = tmp_path / "ran"
    places = {"PROGRAM": program, "OUT": tmp_path / "out", "NODIR": tmp_path / "missing"}
    for word, path in places.items():
        args = [a.replace(word, str(path)) for a in args]
    result = record(args, tmp_path, env={"RAN_MARKER": str(marker)})
    assert result.returncode == 2, result.stderr
    assert message in result.stderr, result.stderr
    assert "hotspan record: error:" in result.stderr
    assert not marker.exists()  # refused before the program ran
    assert not list(tmp_path.glob("out*"))


def test_nothing_recorded_is_an_error(tmp_path: Path) -> None:
    out = tmp_path / "empty.pb.gz"
    # (Threads would always have one: the main thread's stack at exit.)
    result = record(["-o", str(out), "--types", "cpu", "--", "python", "-c", "pass"], tmp_path)
    # Started and gone before the agent took anything: no file, and no success.
    if out.exists():
        pytest.skip("the agent caught a sample of a program that did nothing")
    assert result.returncode == 1
    assert "nothing was recorded" in result.stderr
