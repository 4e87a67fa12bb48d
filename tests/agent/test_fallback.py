"""Where the C extension cannot be had, hotspan still installs and the agent still profiles.

A build that fails (no compiler, an interpreter whose internals the C code does not know) must
never fail the install: the wheel is then pure Python.  And an agent that asked for the native
sampler but got the pure-Python one says so, once a process, with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_failing_compiler_still_installs(tmp_path: Path) -> None:
    source = tmp_path / "src"
    # A copy without the extensions built in place, as a fresh checkout is.
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", "*.so", "build", "*.egg-info", "__pycache__", "bench"
        ),
    )
    out = tmp_path / "wheels"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q"] + ["-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CC": "false", "LDSHARED": "false"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = out.glob("hotspan-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "hotspan/agent/sampler.py" in names
    assert not [n for n in names if n.endswith(".so")], names


PROGRAM = """
import sys

class NoSampler:
    # As if the extension were not built: its import fails.
    def find_spec(self, name, path=None, target=None):
        if name == "hotspan._speedups._sampler":
            raise ImportError("hidden by the test")
        return None

sys.meta_path.insert(0, NoSampler())
import time
import hotspan

for _ in range(2):
    agent = hotspan.configure(application_name="fallback", server_address="http://127.0.0.1:9",
                              upload_interval=60)
    print("sampler", agent.sampler_name, flush=True)
    end = time.thread_time() + 0.2
    while time.thread_time() < end:
        pass
    hotspan.shutdown(flush=False)
"""


def test_the_fallback_says_so_once(tmp_path: Path) -> None:
    script = tmp_path / "fallback.py"
    script.write_text(textwrap.dedent(PROGRAM))
    env = {k: v for k, v in os.environ.items() if k != "HOTSPAN_NO_SPEEDUPS"}
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split().count("sampler") == 2, proc.stdout
    assert "sampler native" not in proc.stdout, proc.stdout
    notices = [line for line in proc.stderr.splitlines() if "pure-Python sampler" in line]
    assert len(notices) == 1, proc.stderr
    assert "hidden by the test" in notices[0], notices
