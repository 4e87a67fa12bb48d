"""``hotspan run``: profile a program without changing its code.

Like ``opentelemetry-instrument`` or ``ddtrace-run``: the program runs as a child process
whose ``PYTHONPATH`` starts with the ``bootstrap`` directory, so Python imports its
``sitecustomize`` before any of the program's code; that calls :func:`bootstrap`, which reads
the settings this side passed as ``HOTSPAN_*`` variables and starts the agent.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from hotspan.agent.config import (
    AgentConfig,
    ConfigError,
    check_tag_key,
    env_value,
    from_env,
    parse_tags,
    request_headers,
)

BOOTSTRAP_DIR = str(Path(__file__).resolve().parent / "bootstrap")

# "<trace id>-<span id>", set in a profiled process once it has a root span, so the Python
# processes it starts (inheriting PYTHONPATH, hence profiled too) are tagged with its trace
# instead of starting their own.
ROOT_MARKER = "HOTSPAN_RUN_ROOT_SPAN"
# A file `hotspan run` reads after the program: the root span's trace id, which the process
# that made the span writes (and takes out of its environment, for its children have none).
REPORT_VARIABLE = "HOTSPAN_RUN_REPORT"
# "false" where the run gets no root span: a server, whose requests are traces of their own;
# "auto" where it has one until the program listens on a TCP socket (see step_aside_if_serving).
ROOT_SPAN_VARIABLE = "HOTSPAN_RUN_ROOT"
# The pid of `hotspan run`: the bootstrap reports a failure only in its direct child.
PARENT_VARIABLE = "HOTSPAN_RUN_PARENT"

# Programs that serve requests, by the command's name or the module run with -m: their
# requests are traces of their own, and a span around the whole run would make them one.
SERVER_COMMANDS = frozenset(
    {"gunicorn", "uvicorn", "hypercorn", "waitress-serve", "daphne", "granian", "celery"}
)
SERVER_MODULES = frozenset(
    {
        "gunicorn",
        "uvicorn",
        "hypercorn",
        "waitress",
        "daphne",
        "granian",
        "celery",
        "http.server",
        "aiohttp.web",
    }
)

USAGE = (
    "hotspan run [options] -- python app.py [args...]\n"
    "       hotspan run [options] -m module [args...]\n"
    "       hotspan run [options] app.py [args...]\n"
    "       hotspan run [options] -- console-script [args...]"
)

# A bare python, python3 or python3.N of our own version.
_PYTHON = re.compile(rf"python(3(\.{sys.version_info[1]})?)?")
# Options of the interpreter that take a value, so the script is not mistaken for one.
_PYTHON_VALUE_OPTIONS = {"-W", "-X", "-Q", "--check-hash-based-pycs"}

# Signals a supervisor sends to the process it started, which is this one, not the program.
_FORWARDED = ("SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2")
# Keyboard signals: a terminal sends them to its whole foreground group, child included.
_KEYBOARD = ("SIGINT", "SIGQUIT")


class UsageError(Exception):
    pass


def add_program_options(parser: argparse.ArgumentParser) -> None:
    """The options of every command that starts a profiled program (run and record)."""
    parser.add_argument(
        "--application-name",
        help="service name of the profiles and the root span (default: the script, module "
        "or command name)",
    )
    parser.add_argument("--sample-rate", type=int, metavar="HZ", help="samples per second")
    parser.add_argument(
        "--upload-interval", type=float, metavar="SECONDS", help="seconds between uploads"
    )
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a module as a script")


EXAMPLES = """\
examples:
  hotspan run --application-name nightly -- python job.py --day 2024-05-01
  hotspan run --tag commit=abc123 -m jobs.nightly
  hotspan run --server-address http://profiles:4040 -- gunicorn app:app
After the job: "hotspan: trace <id>, its profile: <server>/traces/<id>" on stderr.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hotspan run",
        usage=USAGE,
        # split_argv must know where our options end: `--app x` is no abbreviation here.
        allow_abbrev=False,
        description="Run a Python program with the hotspan agent started before its code. "
        "Each option can also be set with its HOTSPAN_* (or PYROSCOPE_*) environment "
        "variable; options win.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_program_options(parser)
    parser.add_argument("--server-address", help="hotspan or Pyroscope server URL")
    parser.add_argument(
        "--tag",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a tag on every profile; repeatable (added to HOTSPAN_TAGS / PYROSCOPE_TAGS)",
    )
    parser.add_argument("--auth-token", help="bearer token for the server")
    parser.add_argument("--tenant-id", help="tenant (X-Scope-OrgID)")
    parser.add_argument(
        "--no-trace-correlation",
        action="store_true",
        help="no root span, and no span ids on samples",
    )
    parser.add_argument(
        "--root-span",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="wrap the run in one root span (a trace for the whole run), or not; by default "
        "yes, but for servers (gunicorn, uvicorn, hypercorn, waitress, daphne, granian, "
        "celery, Django's runserver, flask run), whose requests are traces of their own",
    )
    return parser


def _options_with_value(parser: argparse.ArgumentParser) -> set:
    return {s for a in parser._actions if a.nargs != 0 for s in a.option_strings}


def split_argv(argv: Sequence[str], parser: argparse.ArgumentParser) -> Tuple[List[str], List[str]]:
    """(hotspan's options, the command): the command starts after ``--``, after ``-m MODULE``
    (which it includes) or at the first argument that is not an option of ours."""
    takes_value = _options_with_value(parser)
    argv = list(argv)
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return argv[:i], argv[i + 1 :]
        if arg == "-m" or (arg.startswith("-m") and not arg.startswith("--")):
            # Everything after the module is the module's own argv.
            end = i + 2 if arg == "-m" else i + 1
            return argv[:end], argv[end:]
        if not arg.startswith("-") or arg == "-":
            return argv[:i], argv[i:]
        name = arg.split("=", 1)[0]
        i += 2 if name in takes_value and "=" not in arg else 1
    return argv, []


def build_command(options: argparse.Namespace, rest: List[str]) -> List[str]:
    if options.module:
        return [sys.executable, "-m", options.module, *rest]
    if not rest:
        raise UsageError(
            "nothing to run: give the program after the options, as in "
            "'hotspan run -- python app.py' or 'hotspan run -m module'"
        )
    program = rest[0]
    # A bare python would be whichever is first on PATH; ours has hotspan importable.
    if _PYTHON.fullmatch(program):
        return [sys.executable, *rest[1:]]
    if program.endswith(".py"):
        return [sys.executable, *rest]
    return rest


def python_target(args: Sequence[str]) -> Tuple[str, str, List[str]]:
    """(module, script, their arguments) of a Python interpreter's arguments: what ``-m``
    names, or the script; both "" for ``-c`` or none."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "-m" and i + 1 < len(args):
            return args[i + 1], "", list(args[i + 2 :])
        if arg.startswith("-m") and len(arg) > 2 and not arg.startswith("--"):
            return arg[2:], "", list(args[i + 1 :])
        if arg.startswith("-c"):
            return "", "", []
        if arg in _PYTHON_VALUE_OPTIONS:
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        return "", arg, list(args[i + 1 :])
    return "", "", []


def serves_requests(command: List[str]) -> bool:
    """Whether ``command`` starts a server: a known server's command or module, or a
    framework's command that serves (``manage.py runserver``, ``flask run``)."""
    rest = command[1:]
    if command[0] == sys.executable:
        module, script, rest = python_target(rest)
        if script:
            # A script: Django's manage.py runserver, say.
            return _script_name(script) == "manage" and "runserver" in rest
        return module in SERVER_MODULES or (module == "flask" and "run" in rest)
    name = Path(command[0]).name
    if name in SERVER_COMMANDS:
        return True
    if name == "flask":
        return "run" in rest
    return name in ("manage.py", "django-admin") and "runserver" in rest


def default_application_name(command: List[str]) -> str:
    """The module, the script's name without ``.py``, or the command's name."""
    if command[0] == sys.executable:
        module, script, _ = python_target(command[1:])
        return module or (_script_name(script) if script else "python")
    return _script_name(command[0])


def _script_name(path: str) -> str:
    p = Path(path)
    if p.name == "__main__.py":
        return p.resolve().parent.name or "python"
    return p.stem if p.suffix == ".py" else p.name


def child_environment(
    options: argparse.Namespace, command: List[str], environ: Dict[str, str]
) -> Dict[str, str]:
    """The child's environment: ours, the options as HOTSPAN_* variables (so they win over
    PYROSCOPE_* ones) and PYTHONPATH starting with the bootstrap directory."""
    env = dict(environ)
    env.pop(ROOT_MARKER, None)  # a `hotspan run` inside a profiled program starts anew
    env.pop(REPORT_VARIABLE, None)
    name = options.application_name
    if not name:
        found = env_value("APPLICATION_NAME", env)
        name = found[1] if found else default_application_name(command)
    env["HOTSPAN_APPLICATION_NAME"] = name
    # getattr: hotspan record's options are only some of these.
    for suffix in ("SERVER_ADDRESS", "SAMPLE_RATE", "UPLOAD_INTERVAL", "AUTH_TOKEN", "TENANT_ID"):
        value = getattr(options, suffix.lower(), None)
        if value is not None:
            env["HOTSPAN_" + suffix] = str(value)
    if getattr(options, "no_trace_correlation", False):
        env["HOTSPAN_TRACE_CORRELATION"] = "false"
    root_span = getattr(options, "root_span", None)
    if root_span is None:
        env[ROOT_SPAN_VARIABLE] = "false" if serves_requests(command) else "auto"
    else:
        env[ROOT_SPAN_VARIABLE] = "true" if root_span else "false"
    tag_options = getattr(options, "tag", None)
    if tag_options:
        found = env_value("TAGS", env)
        tags = parse_tags(found[1]) if found else {}
        tags.update(_parse_tag_options(tag_options))
        env["HOTSPAN_TAGS"] = ",".join(f"{k}={v}" for k, v in tags.items())
    # Who says why it is not profiled: the program itself, not the processes it starts with
    # another Python (their stderr may be output their parent reads).
    env[PARENT_VARIABLE] = str(os.getpid())
    # Empty entries stay: they mean the current directory.
    existing = env.get("PYTHONPATH")
    paths = [p for p in existing.split(os.pathsep) if p != BOOTSTRAP_DIR] if existing else []
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *paths])
    return env


def _parse_tag_options(items: List[str]) -> Dict[str, str]:
    tags: Dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--tag {item!r} is not key=value")
        if "," in value:
            raise UsageError(f"--tag {item!r}: a tag value cannot contain ','")
        check_tag_key(key.strip())
        tags[key.strip()] = value.strip()
    return tags


def prepare(
    parser: argparse.ArgumentParser, argv: Sequence[str]
) -> Tuple[argparse.Namespace, List[str], Dict[str, str]]:
    """(options, command, child environment) of ``argv``; bad input exits 2 (parser.error)."""
    own, rest = split_argv(argv, parser)
    options = parser.parse_args(own)
    try:
        command = build_command(options, rest)
        env = child_environment(options, command, dict(os.environ))
    except (UsageError, ConfigError) as exc:
        parser.error(str(exc))
    return options, command, env


def check_settings(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> AgentConfig:
    """The child's settings; bad ones are the user's to fix now (exit 2), not a warning the
    program prints later."""
    try:
        return from_env(env).validate()
    except ConfigError as exc:
        parser.error(str(exc))
        raise  # parser.error exits: this is for type checkers


def main(argv: Sequence[str]) -> int:
    """``hotspan run ARGV``: the program's exit code (128+N when signal N ended it)."""
    parser = build_parser()
    _options, command, env = prepare(parser, argv)
    config = check_settings(parser, env)
    if env[ROOT_SPAN_VARIABLE] == "false" and config.trace_correlation:
        # Said first: a server runs until it is stopped.
        why = "" if _options.root_span is False else f"{Path(command[0]).name} serves requests: "
        print(
            f"hotspan: {why}no root span for this run; each request is a trace of its own "
            "(--root-span wraps the run in one)",
            file=sys.stderr,
        )
    with tempfile.TemporaryDirectory(prefix="hotspan-run-") as scratch:
        # The child writes its root span's ids here (see bootstrap), for the line below.
        report = env[REPORT_VARIABLE] = os.path.join(scratch, "root-span")
        code = run_child(command, env)
        trace_id = _read_report(report)
    if trace_id:
        link = f"{config.server_address.rstrip('/')}/traces/{trace_id}"
        print(f"hotspan: trace {trace_id}, its profile: {link}", file=sys.stderr)
    return code


def _read_report(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            trace_id = f.read().strip()
    except (OSError, ValueError):
        return ""
    return trace_id if re.fullmatch(r"[0-9a-f]{32}", trace_id) else ""


def run_child(command: List[str], env: Dict[str, str]) -> int:
    """Run ``command``, passing on the signals meant for it; its exit code, 128+N for signal N."""
    child: Optional[subprocess.Popen] = None
    pending: List[int] = []
    keyboard = {getattr(signal, n) for n in _KEYBOARD if hasattr(signal, n)}
    keyboard_reaches_child = _in_terminal_foreground()

    def forward(signum: int, _frame: object) -> None:
        if signum in keyboard and keyboard_reaches_child:
            return  # the terminal sent it to the child as well; twice would be too many
        if child is None:
            pending.append(signum)
            return
        with contextlib.suppress(OSError):  # it has just exited
            child.send_signal(signum)

    # Handlers first, so a signal that comes while the child starts is not lost (or fatal).
    previous = {}
    for name in _FORWARDED + _KEYBOARD:
        signum = getattr(signal, name, None)
        if signum is not None:
            previous[signum] = signal.signal(signum, forward)
    try:
        try:
            child = subprocess.Popen(command, env=env)
        except FileNotFoundError:
            print(f"hotspan: {command[0]}: command not found", file=sys.stderr)
            return 127
        except OSError as exc:
            print(f"hotspan: cannot run {command[0]}: {exc}", file=sys.stderr)
            return 126
        for signum in pending:
            forward(signum, None)
        code = child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 128 - code if code < 0 else code


def _in_terminal_foreground() -> bool:
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgrp()
        except (AttributeError, OSError, ValueError):
            continue
    return False


# --- the child's side, called by bootstrap/sitecustomize.py --------------------------------


def warn(message: str) -> None:
    try:
        sys.stderr.write(f"hotspan: {message}\n")
        sys.stderr.flush()
    except Exception:
        pass  # no stderr (pythonw, closed): nothing to tell, and the program must go on


_bootstrapped = False

# What to do when the OpenTelemetry SDK is not there: the ImportError alone ("cannot import name
# 'context' from 'opentelemetry' (unknown location)") says neither what is missing nor why.
OTEL_MISSING = (
    "no root span, so no trace id for this run: the OpenTelemetry SDK is not installed. "
    "Add it with pip install 'hotspan[otel]' (from PyPI) or pip install -e '.[otel]' (in a "
    "checkout of hotspan). Profiling goes on without it"
)


def bootstrap() -> None:
    """Start the agent in this (child) interpreter from its HOTSPAN_*/PYROSCOPE_* settings.

    With trace correlation, the first profiled process gets the root span (see
    :mod:`.batch`) and its ids as tags; the Python processes it starts get the same tags
    through ROOT_MARKER.  Raises on failure: the caller turns that into one warning.
    """
    global _bootstrapped
    if _bootstrapped:
        return  # another bootstrap (ddtrace's, say) chained to ours again
    _bootstrapped = True
    from hotspan.agent import batch, configure, shutdown
    from hotspan.agent.symbols import agent_code

    # Whatever the agent's start costs in the program's main thread (imports, allocations
    # the alloc profile sees) is one `hotspan` frame in its profiles: the caller (our
    # sitecustomize) and this function are hotspan's from the root of the stack.
    caller = sys._getframe(1).f_code
    if caller.co_name == "_start_agent":
        agent_code(caller)
    agent_code(bootstrap.__code__)
    config = from_env().validate()
    tags = dict(config.tags)
    recorder = batch.ExitCodeRecorder()
    root: Optional[batch.RootSpan] = None
    report = os.environ.pop(REPORT_VARIABLE, "")
    wants = os.environ.pop(ROOT_SPAN_VARIABLE, "auto")
    wants_root = wants != "false"
    # file://: hotspan record, which has no server to send a span to.
    to_server = not config.server_address.startswith("file:")
    if config.trace_correlation and to_server and wants_root:
        trace_id, _, span_id = os.environ.get(ROOT_MARKER, "").partition("-")
        if not span_id:
            try:
                root = batch.start_root_span(
                    config.application_name, config.server_address, request_headers(config)
                )
            except batch.OpenTelemetryMissing as exc:
                # What failed to import, for the rare case that is not the missing SDK.
                warn(f"{OTEL_MISSING}. ({exc.__context__ or exc})")
            except Exception as exc:
                # The span is a bonus: profiling goes on without it.
                warn(f"no root span: {type(exc).__name__}: {exc}")
            if root is not None:
                recorder.install()
                trace_id, span_id = root.trace_id_hex, root.span_id_hex
                os.environ[ROOT_MARKER] = f"{trace_id}-{span_id}"
                _write_report(report, trace_id)
        if span_id:
            tags = batch.with_trace_tags(tags, trace_id, span_id)
    try:
        agent = configure(application_name=config.application_name, tags=tags)
    except BaseException:
        if root is not None:
            root.end(None, timeout=1.0)
        raise
    if root is not None and wants == "auto":
        step_aside_if_serving(root, agent, config.application_name, report)

    def at_exit() -> None:
        # The program's own atexit handlers ran already (they were registered later).
        # Profiling stops first: the span's export (HTTP through the OpenTelemetry SDK) is
        # hotspan's work, not the program's, and must not show in the program's profile.
        try:
            shutdown(flush=True)
        except Exception as exc:
            warn(f"last profile not sent: {exc}")
        try:
            if root is not None:
                root.end(recorder.exit_code())
        except Exception as exc:
            warn(f"root span not exported: {exc}")

    done: List[bool] = []

    def at_exit_once() -> None:
        if not done:
            done.append(True)
            at_exit()

    def on_terminate(signum: int, _frame: object) -> None:
        # A SIGTERM with no handler of the program's would end it without its exit handlers:
        # the last profile and the root span would be lost (uvicorn, for one, restores the
        # handler it found and raises the signal again once it has shut down).  They are
        # sent, and the signal then ends the program as it would have.
        signal.signal(signum, signal.SIG_DFL)
        at_exit_once()
        signal.raise_signal(signum)

    agent_code(at_exit.__code__)
    agent_code(at_exit_once.__code__)
    agent_code(on_terminate.__code__)
    # Registered after configure, so this runs before any exit handler the agent has.
    atexit.register(at_exit_once)
    with contextlib.suppress(ValueError, OSError):  # not the main thread, say
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, on_terminate)


def step_aside_if_serving(root: Any, agent: Any, service: str, report: str) -> None:
    """Once the program listens on a TCP socket, it serves requests, each a trace of its own:
    the root span ends there as the trace of its start-up, and neither the samples nor the
    profiles' tags name it from then on."""
    from hotspan.agent.context import LABELS
    from hotspan.agent.serving import on_first_listen
    from hotspan.agent.symbols import agent_code

    # The labels of the root span: every context copied since (threads', asyncio tasks')
    # holds this object until a span of the program's replaces it.
    labels = LABELS.get(None)
    ours = {"trace_id": root.trace_id_hex, "root_span_id": root.span_id_hex}

    def serving(address: Any) -> None:
        root.step_aside(service)
        if labels is not None:
            labels._forget_span()
        os.environ.pop(ROOT_MARKER, None)
        agent.remove_tags(ours)
        _write_report(report, "")
        where = f" on {address[0]}:{address[1]}" if isinstance(address, tuple) else ""
        warn(
            f"the program listens{where}, so it serves requests: each request is a trace of "
            f"its own from now on; its start-up is trace {root.trace_id_hex} "
            "(--root-span keeps one span around the whole run)"
        )

    agent_code(serving.__code__)
    on_first_listen(serving)


def _write_report(path: str, trace_id: str) -> None:
    if not path:
        return
    try:
        with open(path, "w", encoding="ascii") as f:
            f.write(trace_id + "\n")
    except OSError:
        pass  # only the line hotspan run prints at the end is lost
