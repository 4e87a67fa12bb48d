"""``hotspan attach PID`` and ``hotspan detach PID``: the agent in a Python that is running.

CPython 3.14's ``sys.remote_exec`` (PEP 768) runs a script in another interpreter at its next
safe point, with no restart and no change to its code.  The script (written by
:func:`hotspan.agent.attach.remote_script`) starts or stops the agent there and reports in a
file this command waits for.  ``--duration`` with ``-o`` records to a file, as ``hotspan
record`` does, then detaches.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Optional

from hotspan.cli.client import CLIError

# Seconds the target has to reach a safe point and answer: a process busy in C code, or asleep
# in a system call with no timer, runs the script only when it next runs Python.
ANSWER_TIMEOUT = 15.0

EXAMPLES = """\
examples:
  hotspan attach --application-name shop --server-address http://profiles:4040 12345
  hotspan attach --duration 60s -o incident.pb.gz 12345
  hotspan detach 12345
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = command_parser(
        sub, "attach", "start the agent in a running Python 3.14+ process: attach PID"
    )
    _attach_options(parser)
    parser.set_defaults(func=attach_main, log_level="warning")


def command_parser(sub: argparse._SubParsersAction, name: str, text: str) -> Any:
    """The parser of attach or detach: the PID and how long to wait for it."""
    parser = sub.add_parser(
        name,
        help=text,
        description=text,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("pid", type=int, metavar="PID", help="the Python process")
    parser.add_argument(
        "--timeout",
        type=float,
        default=ANSWER_TIMEOUT,
        metavar="SECONDS",
        help=f"how long to wait for the process to answer (default: {ANSWER_TIMEOUT:g})",
    )
    return parser


def _attach_options(parser: argparse.ArgumentParser) -> None:
    from hotspan.cli.record import AGENT_TYPES

    parser.add_argument(
        "--application-name", help="service name of the profiles (default: the program's name)"
    )
    parser.add_argument("--server-address", help="where profiles go (default: the agent's)")
    parser.add_argument(
        "--tag", action="append", metavar="KEY=VALUE", help="a tag of every profile (repeatable)"
    )
    parser.add_argument("--sample-rate", type=int, metavar="HZ", help="samples per second")
    parser.add_argument(
        "--upload-interval", type=float, metavar="SECONDS", help="seconds between uploads"
    )
    parser.add_argument("--auth-token", help="bearer token for the server")
    parser.add_argument("--tenant-id", help="tenant (X-Scope-OrgID)")
    parser.add_argument(
        "--types",
        metavar="LIST",
        help=f"the profiles to take, comma-separated, of {','.join(AGENT_TYPES)} "
        "(default: the agent's defaults; with -o, all of them)",
    )
    parser.add_argument(
        "--duration",
        metavar="DURATION",
        help="with -o: record this long (30s, 5m), then detach and write the file",
    )
    parser.add_argument("-o", "--output", metavar="FILE", help="with --duration: the profile file")


def _duration(text: str) -> float:
    from hotspan.model.durations import DurationError, parse_seconds

    try:
        seconds = parse_seconds(text)
    except DurationError as exc:
        raise CLIError(f"--duration: {exc}") from None
    if seconds <= 0:
        raise CLIError(f"--duration {text!r} must be more than nothing")
    return seconds


def check_remote_exec() -> Any:
    """``sys.remote_exec``, or a CLIError that says what is needed."""
    remote_exec = getattr(sys, "remote_exec", None)
    if remote_exec is None:
        version = ".".join(map(str, sys.version_info[:2]))
        raise CLIError(
            f"attaching needs Python 3.14 or newer (sys.remote_exec, PEP 768); this hotspan "
            f"runs on Python {version}. Run hotspan attach with the target's Python 3.14 "
            "(python3.14 -m hotspan attach PID), or restart the program under hotspan run"
        )
    return remote_exec


def _program_name(pid: int) -> str:
    """The script or module the target runs, for its default service name."""
    from hotspan.agent.run import python_target

    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"pid{pid}"
    words = [w.decode(errors="replace") for w in argv if w]
    if not words:
        return f"pid{pid}"
    module, script, _ = python_target(words[1:])
    return module or (Path(script).stem if script else Path(words[0]).name)


def _settings(options: argparse.Namespace, spool: Optional[str]) -> Dict[str, str]:
    """The HOTSPAN_* settings the target's agent starts with (over its own environment),
    checked here so that a bad one is the user's message, not the target's."""
    from hotspan.agent.config import ConfigError, from_env, parse_tags

    env: Dict[str, str] = {
        "HOTSPAN_APPLICATION_NAME": options.application_name or _program_name(options.pid),
        "HOTSPAN_ENABLED": "true",
    }
    for suffix in ("SERVER_ADDRESS", "SAMPLE_RATE", "UPLOAD_INTERVAL", "AUTH_TOKEN", "TENANT_ID"):
        value = getattr(options, suffix.lower(), None)
        if value is not None:
            env["HOTSPAN_" + suffix] = str(value)
    if options.tag:
        try:
            tags = parse_tags(",".join(options.tag))
        except ConfigError as exc:
            raise CLIError(f"--tag: {exc}") from None
        env["HOTSPAN_TAGS"] = ",".join(f"{k}={v}" for k, v in tags.items())
    if spool is not None:
        from hotspan.cli.record import AGENT_TYPES, record_environment

        record = argparse.Namespace(types=options.types or ",".join(AGENT_TYPES))
        record_environment(env, spool, record)
    elif options.types:
        from hotspan.cli.record import types_environment

        types_environment(env, options.types)
    try:
        from_env(env).validate()
    except ConfigError as exc:
        raise CLIError(str(exc)) from None
    return env


def _run(pid: int, action: str, settings: Optional[Dict[str, str]], timeout: float) -> Dict:
    """Runs ``action`` (start or stop) in process ``pid``; its report."""
    from hotspan.agent.attach import remote_script

    remote_exec = check_remote_exec()
    if not Path(f"/proc/{pid}").exists():
        raise CLIError(f"no process {pid}")
    scratch = tempfile.mkdtemp(prefix="hotspan-attach-")
    # The target may run as another user (root attaching to a service): it reads the script
    # and settings here and writes its answer.
    os.chmod(scratch, 0o777)  # noqa: S103
    try:
        status = os.path.join(scratch, "status.json")
        paths = [status]
        if settings is not None:
            settings_path = os.path.join(scratch, "settings.json")
            with open(settings_path, "w", encoding="utf-8") as f:
                json.dump(settings, f)
            paths.insert(0, settings_path)
        package_root = str(Path(__file__).resolve().parents[2])
        script = os.path.join(scratch, "script.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(remote_script(action, package_root, *paths))
        for path in (*paths[:-1], script):
            os.chmod(path, 0o644)
        try:
            remote_exec(pid, script)
        except PermissionError:
            raise CLIError(
                f"not allowed to attach to process {pid}: run as its user or as root (the "
                "kernel's ptrace rules apply: CAP_SYS_PTRACE, /proc/sys/kernel/yama/ptrace_scope)"
            ) from None
        except ProcessLookupError:
            raise CLIError(f"no process {pid}") from None
        except (RuntimeError, OSError) as exc:
            raise CLIError(
                f"process {pid} cannot take the agent: {exc} (it must be CPython 3.14+ of the "
                "same minor version as this one, without PYTHON_DISABLE_REMOTE_DEBUG or "
                "-X disable_remote_debug)"
            ) from None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with open(status, encoding="utf-8") as f:
                    return json.load(f)
            except (OSError, ValueError):
                time.sleep(0.05)
        raise CLIError(
            f"process {pid} did not answer in {timeout:g} s: it runs the script when it next "
            "runs Python code (a process blocked in C code or asleep without a timer does not); "
            "if it answers later, its agent starts then (hotspan detach stops it)"
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def attach_main(options: argparse.Namespace) -> int:
    if (options.duration is None) != (options.output is None):
        raise CLIError("--duration and -o go together: record this long into this file")
    spool = tempfile.mkdtemp(prefix="hotspan-attach-record-") if options.output else None
    try:
        if spool is not None:
            os.chmod(spool, 0o777)  # noqa: S103 - the target's agent writes its profiles here
            seconds = _duration(options.duration)
        answer = _run(options.pid, "start", _settings(options, spool), options.timeout)
        if not answer.get("ok"):
            raise CLIError(f"process {options.pid}: {answer.get('error')}")
        print(
            f"hotspan: profiling process {options.pid} as {answer.get('application_name')} "
            f"(hotspan {answer.get('version')}, {answer.get('sampler')} sampler)",
            file=sys.stderr,
        )
        if spool is None:
            return 0
        started = time.monotonic()
        # Ctrl-C ends the recording early: what was taken is written.
        with contextlib.suppress(KeyboardInterrupt):
            time.sleep(seconds)
        stopped = _run(options.pid, "stop", None, options.timeout)
        if not stopped.get("ok"):
            raise CLIError(f"process {options.pid}: {stopped.get('error')}")
        return _write(options, spool, time.monotonic() - started)
    finally:
        if spool is not None:
            shutil.rmtree(spool, ignore_errors=True)


def _write(options: argparse.Namespace, spool: str, elapsed: float) -> int:
    from hotspan.cli import record

    record_options = argparse.Namespace(
        output=options.output,
        format=None,
        profile_type=None,
        types=options.types or ",".join(record.AGENT_TYPES),
        application_name=options.application_name or _program_name(options.pid),
        module=None,
    )
    fmt, wanted = record.output_settings(record_options)
    return record.write_recording(record_options, fmt, wanted, spool, 0, elapsed)


def detach_main(options: argparse.Namespace) -> int:
    answer = _run(options.pid, "stop", None, options.timeout)
    if not answer.get("ok"):
        raise CLIError(f"process {options.pid}: {answer.get('error')}")
    print(f"hotspan: stopped profiling process {options.pid}", file=sys.stderr)
    return 0
