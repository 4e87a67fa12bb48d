"""Agent settings: keyword arguments of :func:`hotspan.configure`, else environment variables.

Pyroscope's variable names are read too, so a service already set up for ``pyroscope-io``
needs no change: ``HOTSPAN_X`` wins over ``PYROSCOPE_X`` when both are set.
"""

from __future__ import annotations

import binascii
import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Dict, List, Mapping, Optional, Tuple

DEFAULT_SERVER_ADDRESS = "http://127.0.0.1:4040"
DEFAULT_BUFFER_BYTES = 16 * 1024 * 1024
DEFAULT_REDACT = ("password", "secret", "credential", "token")
# server_address values that mean "upload nowhere": the pull endpoints serve the profiles.
PULL_ONLY_ADDRESSES = ("", "none", "off")


class ConfigError(ValueError):
    """A setting that cannot be used; the message names it."""


class AgentConfig:
    """The agent's settings: ``AgentConfig(name=value, ...)``, every other one at its default.

    A plain class, not a dataclass: ``dataclasses`` brings ``inspect``, ``ast`` and ``dis``
    into every profiled program (see ``agent/log.py`` for why that matters).
    """

    application_name: str = ""
    server_address: str = DEFAULT_SERVER_ADDRESS
    sample_rate: int = 100
    upload_interval: float = 10.0
    tags: Dict[str, str] = {}  # noqa: RUF012 - copied per instance
    # Deepest frames kept per stack; the rest of a deeper stack is cut at the root end.
    max_depth: int = 64
    # Which profiles to take.
    cpu: bool = True
    wall: bool = True
    # A thread_name label on every sample.
    thread_name_label: bool = False
    # Span linking: span_id/trace_id labels from the OpenTelemetry span current at each sample.
    trace_correlation: bool = True
    # Label samples with the local root span instead of the innermost span.
    root_spans_only: bool = False
    # "pyroscope": pprof to the server's /ingest; "otlp": OTLP profiles over HTTP to
    # OTEL_EXPORTER_OTLP_(PROFILES_)ENDPOINT, an OpenTelemetry Collector's or hotspan's own.
    exporter: str = "pyroscope"
    # Auth and routing to the server.
    auth_token: str = ""
    basic_auth_username: str = ""
    basic_auth_password: str = ""
    tenant_id: str = ""
    http_headers: Dict[str, str] = {}  # noqa: RUF012 - copied per instance
    # Bytes of profiles kept while the server is away; beyond, the oldest are dropped.
    max_buffer_bytes: int = DEFAULT_BUFFER_BYTES
    # Seconds the exit flush may take.
    exit_flush_timeout: float = 3.0
    # Seconds one upload attempt may take.
    upload_timeout: float = 10.0
    # Use the C sampler when it is built (False forces the pure-Python one).
    native: bool = True
    # Allocations and live heap: one sample per this many bytes allocated on average (0: off).
    # Off by default: the allocator hook sits on every allocation the program makes, which
    # costs 3-7% where Python code allocates as it computes (integer arithmetic, small
    # objects).  Turned on live (the control endpoint, the server's settings), it samples one
    # allocation per live.DEFAULT_ALLOC_SAMPLE_BYTES unless told otherwise.
    alloc_sample_bytes: int = 0
    # Where the C allocator hook is not built: take the allocation profile with tracemalloc,
    # which traces every allocation (often 2x slower): off unless asked for.
    alloc_tracemalloc: bool = False
    # Lock contention: time spent waiting to acquire threading and asyncio locks.
    locks: bool = True
    # Threads and tasks: how many threads and pending asyncio tasks stand on each stack.
    threads: bool = True
    # Start profiling at once (False: the agent runs, idle, until enabled through its control
    # endpoint or the server's settings).
    enabled: bool = True
    # The control endpoint on its own port (0: none; hotspan.control.asgi_app()/wsgi_app() can
    # be mounted in the program instead), and the token its requests must carry ("": none).
    control_port: int = 0
    control_host: str = "127.0.0.1"
    control_token: str = ""
    # Follow the settings the server keeps for this service (read in each upload's answer).
    remote_settings: bool = True
    # Staying within budget, checked every resource_check_interval seconds: above
    # cpu_threshold (% of the CPUs the process may use) or mem_threshold (% of its memory
    # limit) the sample rate halves, down to min_sample_rate; above load_shedding_cpu
    # sampling and uploads pause; the agent's own CPU stays under max_overhead (% of the
    # process's CPU) by lowering the rate.  0 turns a threshold off.
    cpu_threshold: float = 80.0
    mem_threshold: float = 90.0
    load_shedding_cpu: float = 90.0
    max_overhead: float = 1.0
    min_sample_rate: int = 10
    resource_check_interval: float = 2.0
    # Only samples of spans that met a condition (slow, error, high CPU) are uploaded, at
    # conditional_sample_rate when it is set (more detail on the requests that matter).
    conditional_only: bool = False
    conditional_sample_rate: int = 0
    # Regexes (case-insensitive): function names, file names and label values they match
    # leave the process as [REDACTED].  None: the default words; [] turns redaction off.
    redact: Optional[List[str]] = None
    # Bytes per upload at most: beyond, the smallest stacks fold into one "other" frame.
    max_profile_size: int = 10 * 1024 * 1024
    # Runtime stats on every span: its CPU (and process stats at local root spans) set as
    # attributes of each OpenTelemetry SDK span at its detach, which costs a few microseconds
    # a span (the SDK's set_attributes).  Off, only spans that saw a garbage collection or an
    # allocation sample get those figures, and a span's CPU is read from its CPU samples.
    # A cpu_threshold_percent turns it on (high_cpu needs each span's CPU).
    span_stats: bool = False
    # Span conditions (agent/spans.py): a span is "slow" at this duration in seconds (0: off),
    # "error" with an error status (when on), "high_cpu" when its CPU is at least this percent
    # of its duration (0: off).  All off by default: a rule on judges every span the program
    # ends (a C span processor, ~1 us a span, and up to 3 MiB of verdicts: +3% on asyncio
    # requests of four spans per 100 us), and holds each window until its spans have ended.
    slow_request_threshold: float = 0.0
    error_condition: bool = False
    cpu_threshold_percent: float = 0.0

    def __init__(self, **settings: object) -> None:
        unknown = set(settings) - set(SETTINGS)
        if unknown:
            raise TypeError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        for name in SETTINGS:
            value = settings.get(name, getattr(AgentConfig, name))
            if isinstance(value, (dict, list)):
                value = type(value)(value)
            setattr(self, name, value)

    def __repr__(self) -> str:
        def shown(name: str) -> str:
            value = getattr(self, name)
            return "***" if name in _SECRETS and value else repr(value)

        return "AgentConfig(" + ", ".join(f"{n}={shown(n)}" for n in SETTINGS) + ")"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AgentConfig):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in SETTINGS)

    def validate(self) -> AgentConfig:
        if not self.application_name:
            raise ConfigError(
                "application_name is required (or set HOTSPAN_APPLICATION_NAME / "
                "PYROSCOPE_APPLICATION_NAME)"
            )
        # file:///DIR: no server, uploads become files in DIR (what hotspan record uses).
        uploads_to = ("http://", "https://", "file:///")
        if self.uploads() and not self.server_address.startswith(uploads_to):
            raise ConfigError(
                f"server_address {self.server_address!r} must start with http:// or https:// "
                "(or file:///DIR: files, or 'none': pull mode only, no uploads)"
            )
        if not 1 <= self.sample_rate <= 1000:
            raise ConfigError(f"sample_rate {self.sample_rate} must be between 1 and 1000 Hz")
        if not 0.1 <= self.upload_interval <= 3600:
            raise ConfigError(
                f"upload_interval {self.upload_interval} must be between 0.1 and 3600 seconds"
            )
        if not 1 <= self.max_depth <= 1000:
            raise ConfigError(f"max_depth {self.max_depth} must be between 1 and 1000")
        if self.alloc_sample_bytes < 0:
            raise ConfigError(
                f"alloc_sample_bytes {self.alloc_sample_bytes} must not be negative (0 is off)"
            )
        if self.max_buffer_bytes < 0:
            raise ConfigError("max_buffer_bytes must not be negative")
        if not 0 <= self.control_port <= 65535:
            raise ConfigError(f"control_port {self.control_port} must be between 0 and 65535")
        for name in ("cpu_threshold", "mem_threshold", "load_shedding_cpu"):
            if not 0 <= getattr(self, name) <= 100:
                raise ConfigError(f"{name} {getattr(self, name)} must be a percent (0 is off)")
        if not 0 < self.max_overhead <= 100:
            raise ConfigError(f"max_overhead {self.max_overhead} must be a percent above 0")
        if not 1 <= self.min_sample_rate <= 1000:
            raise ConfigError(f"min_sample_rate {self.min_sample_rate} must be 1 to 1000 Hz")
        if not 0 <= self.conditional_sample_rate <= 1000:
            raise ConfigError(
                f"conditional_sample_rate {self.conditional_sample_rate} must be 0 to 1000 Hz"
            )
        if not 0.1 <= self.resource_check_interval <= 3600:
            raise ConfigError("resource_check_interval must be between 0.1 and 3600 seconds")
        if self.max_profile_size < 4096:
            raise ConfigError(f"max_profile_size {self.max_profile_size} must be >= 4096 bytes")
        from hotspan.model.redaction import RedactError, Redactor

        try:
            Redactor(self.redact_patterns())  # compiled as the agent will compile them
        except RedactError as exc:
            raise ConfigError(str(exc)) from None
        if not self.slow_request_threshold >= 0:  # NaN too
            raise ConfigError(
                f"slow_request_threshold {self.slow_request_threshold} must not be negative "
                "(seconds; 0 is off)"
            )
        if not self.cpu_threshold_percent >= 0:
            raise ConfigError(
                f"cpu_threshold_percent {self.cpu_threshold_percent} must not be negative "
                "(0 is off)"
            )
        for key in self.tags:
            check_tag_key(key)
        if self.exporter not in EXPORTERS:
            raise ConfigError(f"exporter {self.exporter!r} must be one of {', '.join(EXPORTERS)}")
        return self

    def uploads(self) -> bool:
        """False in pull mode only (``server_address="none"``, or ""): profiles leave the
        process through the ``/debug/pprof`` endpoints alone (see agent/pull.py)."""
        return self.server_address.strip().lower() not in PULL_ONLY_ADDRESSES

    def redact_patterns(self) -> List[str]:
        return list(DEFAULT_REDACT if self.redact is None else self.redact)


EXPORTERS = ("pyroscope", "otlp")
OTLP_PROTOCOLS = ("http/protobuf", "grpc")
# OTLP's default endpoints and the path of the profiles signal over HTTP.
OTLP_DEFAULT_ENDPOINTS = {"http/protobuf": "http://localhost:4318", "grpc": "http://localhost:4317"}
OTLP_PROFILES_PATH = "/v1development/profiles"


def otlp_profiles_target(
    environ: Optional[Mapping[str, str]] = None,
) -> Tuple[str, Dict[str, str], str]:
    """Where OTLP profiles go, the headers they carry and the protocol, from the
    OpenTelemetry exporter variables: ``OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL`` or
    ``..._PROTOCOL`` (``http/protobuf``, the default, or ``grpc``);
    ``OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT`` (as is), else ``OTEL_EXPORTER_OTLP_ENDPOINT``
    (plus the signal's path over HTTP), else localhost's 4318 or 4317; headers from
    ``OTEL_EXPORTER_OTLP_HEADERS`` and ``..._PROFILES_HEADERS`` (``k=v,...``, URL-encoded)."""
    from urllib.parse import unquote

    env = os.environ if environ is None else environ
    protocol = "http/protobuf"
    for var in ("OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        given = env.get(var, "").strip()
        if given:
            if given not in OTLP_PROTOCOLS:
                raise ConfigError(
                    f"{var}={given!r}: hotspan's agent sends OTLP profiles over "
                    f"{' or '.join(OTLP_PROTOCOLS)}"
                )
            protocol = given
            break
    endpoint = env.get("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", "").strip()
    if not endpoint:
        base = (
            env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or OTLP_DEFAULT_ENDPOINTS[protocol]
        )
        endpoint = base.rstrip("/") + (OTLP_PROFILES_PATH if protocol == "http/protobuf" else "")
    headers: Dict[str, str] = {}
    for var in ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_PROFILES_HEADERS"):
        for part in env.get(var, "").split(","):
            key, sep, value = part.partition("=")
            if sep and key.strip():
                headers[unquote(key.strip())] = unquote(value.strip())
    return endpoint, headers, protocol


# Every setting, in the order the class names them.
SETTINGS = tuple(AgentConfig.__annotations__)
_SECRETS = frozenset(("auth_token", "basic_auth_password"))

# The app{k=v,...} name syntax has no escaping: tag values lose these characters.
NAME_SYNTAX_CHARS = frozenset('{},="')


def check_tag_key(key: str) -> None:
    if (
        not key
        or not (key[0].isalpha() or key[0] == "_")
        or not all(c.isalnum() or c in "_." for c in key)
    ):
        raise ConfigError(f"tag name {key!r} must be letters, digits, '_' or '.'")


def parse_tags(text: str) -> Dict[str, str]:
    """``k=v,k2=v2`` (the PYROSCOPE_TAGS form) to a dict; a part without ``=`` is an error."""
    tags: Dict[str, str] = {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep:
            raise ConfigError(f"tag {part!r} is not key=value")
        tags[key.strip()] = value.strip()
    return tags


def parse_patterns(text: str) -> List[str]:
    """HOTSPAN_REDACT: patterns separated by commas, or a JSON array when one has a comma;
    "none" (or an empty array) turns redaction off."""
    text = text.strip()
    if text.lower() == "none":
        return []
    if text.startswith("["):
        import json

        try:
            patterns = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"not a JSON array of patterns: {exc}") from None
        if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
            raise ConfigError("not a JSON array of strings")
        return patterns
    return [p.strip() for p in text.split(",") if p.strip()]


def _bool(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name}={text!r} is not a boolean (true/false)")


# Setting -> variable suffix; read as HOTSPAN_<suffix>, then PYROSCOPE_<suffix>.
_ENV_NAMES = {
    "application_name": "APPLICATION_NAME",
    "server_address": "SERVER_ADDRESS",
    "exporter": "EXPORTER",
    "sample_rate": "SAMPLE_RATE",
    "upload_interval": "UPLOAD_INTERVAL",
    "tags": "TAGS",
    "max_depth": "MAX_DEPTH",
    "cpu": "CPU",
    "wall": "WALL",
    "thread_name_label": "THREAD_NAME_LABEL",
    "trace_correlation": "TRACE_CORRELATION",
    "root_spans_only": "ROOT_SPANS_ONLY",
    "auth_token": "AUTH_TOKEN",
    "basic_auth_username": "BASIC_AUTH_USERNAME",
    "basic_auth_password": "BASIC_AUTH_PASSWORD",
    "tenant_id": "TENANT_ID",
    "max_buffer_bytes": "MAX_BUFFER_BYTES",
    "native": "NATIVE",
    "alloc_sample_bytes": "ALLOC_SAMPLE_BYTES",
    "alloc_tracemalloc": "ALLOC_TRACEMALLOC",
    "locks": "LOCKS",
    "threads": "THREADS",
    "http_headers": "HTTP_HEADERS",
    "exit_flush_timeout": "EXIT_FLUSH_TIMEOUT",
    "upload_timeout": "UPLOAD_TIMEOUT",
    "enabled": "ENABLED",
    "control_port": "CONTROL_PORT",
    "control_host": "CONTROL_HOST",
    "control_token": "CONTROL_TOKEN",
    "remote_settings": "REMOTE_SETTINGS",
    "cpu_threshold": "CPU_THRESHOLD",
    "mem_threshold": "MEM_THRESHOLD",
    "load_shedding_cpu": "LOAD_SHEDDING_CPU",
    "max_overhead": "MAX_OVERHEAD",
    "min_sample_rate": "MIN_SAMPLE_RATE",
    "resource_check_interval": "RESOURCE_CHECK_INTERVAL",
    "conditional_only": "CONDITIONAL_ONLY",
    "conditional_sample_rate": "CONDITIONAL_SAMPLE_RATE",
    "redact": "REDACT",
    "max_profile_size": "MAX_PROFILE_SIZE",
    "span_stats": "SPAN_STATS",
    "slow_request_threshold": "SLOW_REQUEST_THRESHOLD",
    "error_condition": "ERROR_CONDITION",
    "cpu_threshold_percent": "CPU_THRESHOLD_PERCENT",
}


# Other names a setting is known by (keyword and variable): the issue and other profilers'
# documentation call the stack depth limit max_stack_depth.
ALIASES = {"max_stack_depth": "max_depth"}
_ENV_ALIASES = {"MAX_DEPTH": "MAX_STACK_DEPTH"}


def env_value(suffix: str, environ: Mapping[str, str]) -> Optional[tuple]:
    """(variable name, value) of the first of HOTSPAN_<suffix>, PYROSCOPE_<suffix> set."""
    for prefix in ("HOTSPAN_", "PYROSCOPE_"):
        for name in (prefix + suffix, prefix + _ENV_ALIASES.get(suffix, suffix)):
            if environ.get(name, "") != "":
                return name, environ[name]
    return None


def from_env(environ: Optional[Mapping[str, str]] = None, **overrides: object) -> AgentConfig:
    """Settings from ``overrides`` (keyword arguments), then the environment, then defaults."""
    environ = os.environ if environ is None else environ
    for alias, name in ALIASES.items():
        if alias in overrides:
            overrides.setdefault(name, overrides.pop(alias))
    unknown = set(overrides) - set(SETTINGS)
    if unknown:
        raise ConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}")
    config = AgentConfig()
    for name, suffix in _ENV_NAMES.items():
        found = env_value(suffix, environ)
        if found is None:
            continue
        var, text = found
        try:
            setattr(config, name, _convert(name, var, text, getattr(config, name)))
        except ValueError as exc:
            raise ConfigError(f"{var}={text!r}: {exc}") from None
    for name, value in overrides.items():
        if value is None:
            continue
        if name in ("tags", "http_headers"):
            value = {str(k): str(v) for k, v in dict(value).items()}  # type: ignore[call-overload]
        elif name == "redact":
            value = [value] if isinstance(value, str) else [str(p) for p in value]  # type: ignore[attr-defined]
        setattr(config, name, value)
    return config


def _convert(name: str, var: str, text: str, default: object) -> object:
    if name in ("tags", "http_headers"):
        return parse_tags(text)
    if name == "redact":
        return parse_patterns(text)
    if isinstance(default, bool):
        return _bool(var, text)
    if isinstance(default, int):
        return int(text)
    if isinstance(default, float):
        return float(text)
    return text


def request_headers(config: AgentConfig) -> Dict[str, str]:
    """The headers every request to the server carries (profiles and the run's root span):
    ``http_headers``, then auth and tenant."""
    headers = dict(config.http_headers)
    if config.auth_token:
        headers["Authorization"] = f"Bearer {config.auth_token}"
    elif config.basic_auth_username or config.basic_auth_password:
        pair = f"{config.basic_auth_username}:{config.basic_auth_password}".encode()
        headers["Authorization"] = "Basic " + binascii.b2a_base64(pair, newline=False).decode(
            "ascii"
        )
    if config.tenant_id:
        headers["X-Scope-OrgID"] = config.tenant_id
    return headers
