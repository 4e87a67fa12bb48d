"""The scrape file of ``hotspan server --scrape FILE``: which targets' Go ``/debug/pprof``
endpoints to pull, and how often (the scraper itself is server.api.scrape).

The file is YAML (JSON is YAML too), shaped as Prometheus's and Grafana Alloy's::

    scrape_interval: 15s          # default 15s
    scrape_timeout: 10s           # beyond the N seconds of a CPU profile; default 10s
    scrape_configs:
      - job_name: checkout        # service_name, unless the labels give one
        scrape_interval: 10s      # the job's own, optional
        scheme: http              # or https
        path_prefix: /debug/pprof
        profiles: [cpu, heap, allocs, mutex, goroutine]   # default: all the target serves
        tenant: team-a            # optional: X-Scope-OrgID of what is stored
        bearer_token: secret      # optional: sent as Authorization: Bearer
        static_configs:
          - targets: ["127.0.0.1:6060", "10.0.0.7:6060"]
            labels: {env: prod}
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from hotspan.model.durations import parse_seconds
from hotspan.model.labels import SERVICE_NAME, is_valid_label_name
from hotspan.server.tenants import is_tenant

DEFAULT_INTERVAL_S = 15.0
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_PREFIX = "/debug/pprof"
# Profile -> (path below the prefix, how it is stored)
PROFILES: Dict[str, Tuple[str, str]] = {
    "cpu": ("profile", "as_is"),
    "heap": ("heap", "gauge"),
    "allocs": ("allocs", "delta"),
    "mutex": ("mutex", "delta"),
    "block": ("block", "delta"),
    "goroutine": ("goroutine", "as_is"),
}
DEFAULT_PROFILES = ("cpu", "heap", "allocs", "mutex", "goroutine")
ALIASES = {
    "process_cpu": "cpu",
    "profile": "cpu",
    "inuse": "heap",
    "memory": "heap",
    "alloc": "allocs",
    "goroutines": "goroutine",
    "lock": "mutex",
    "locks": "mutex",
}
TOP_KEYS = {"scrape_interval", "scrape_timeout", "scrape_configs"}
JOB_KEYS = {
    "job_name",
    "static_configs",
    "scheme",
    "profiles",
    "path_prefix",
    "tenant",
    "scrape_interval",
    "scrape_timeout",
    "bearer_token",
}


class ScrapeConfigError(ValueError):
    """A scrape file that cannot be used; the message names the file, the job, the problem."""


@dataclass(frozen=True)
class Target:
    job: str
    instance: str  # host:port
    scheme: str
    path_prefix: str
    labels: Tuple[Tuple[str, str], ...]  # the stored series' labels, service_name included
    tenant: str  # "" for the server's default
    interval_s: float
    timeout_s: float
    profiles: Tuple[str, ...]
    explicit: bool  # profiles listed in the file: a 404 is an error, not "not served"
    bearer_token: str = ""

    def url(self, profile: str, seconds: int = 0) -> str:
        path = f"{self.path_prefix.rstrip('/')}/{PROFILES[profile][0]}"
        query = f"?seconds={seconds}" if seconds else ""
        return f"{self.scheme}://{self.instance}{path}{query}"


@dataclass
class ScrapeConfig:
    path: str
    targets: List[Target]


def load_scrape_config(path: str) -> ScrapeConfig:
    """Reads and checks FILE; ScrapeConfigError names what is wrong."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except OSError as exc:
        raise ScrapeConfigError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
        raise ScrapeConfigError(f"{path}: not YAML: {problem}{where}") from None
    return parse_scrape_config(doc, path)


def parse_scrape_config(doc: Any, path: str = "<scrape config>") -> ScrapeConfig:
    def fail(message: str, job: Optional[str] = None) -> ScrapeConfigError:
        where = f"{path}: job {job!r}: " if job is not None else f"{path}: "
        return ScrapeConfigError(where + message)

    if not isinstance(doc, dict):
        raise fail("must be a mapping with scrape_configs: [...]")
    unknown = set(doc) - TOP_KEYS
    if unknown:
        raise fail(f"unknown key(s) {', '.join(sorted(map(str, unknown)))}")
    interval = _duration(doc.get("scrape_interval"), DEFAULT_INTERVAL_S, "scrape_interval", fail)
    timeout = _duration(doc.get("scrape_timeout"), DEFAULT_TIMEOUT_S, "scrape_timeout", fail)
    jobs = doc.get("scrape_configs")
    if not isinstance(jobs, list) or not jobs:
        raise fail("scrape_configs must be a non-empty list of jobs")
    targets: List[Target] = []
    seen_jobs = set()
    for i, job in enumerate(jobs):
        if not isinstance(job, dict):
            raise fail(f"scrape_configs[{i}] must be a mapping")
        name = job.get("job_name")
        if not isinstance(name, str) or not name:
            raise fail(f"scrape_configs[{i}] needs a job_name")
        if name in seen_jobs:
            raise fail("job_name appears twice", name)
        seen_jobs.add(name)
        targets += _job_targets(job, name, interval, timeout, lambda m, n=name: fail(m, n))
    if not targets:
        raise fail("no targets (static_configs: [{targets: [host:port]}])")
    return ScrapeConfig(path, targets)


def _job_targets(job: Dict[str, Any], name: str, interval: float, timeout: float, fail: Any):
    unknown = set(job) - JOB_KEYS
    if unknown:
        raise fail(f"unknown key(s) {', '.join(sorted(map(str, unknown)))}")
    interval = _duration(job.get("scrape_interval"), interval, "scrape_interval", fail)
    timeout = _duration(job.get("scrape_timeout"), timeout, "scrape_timeout", fail)
    scheme = job.get("scheme", "http")
    if scheme not in ("http", "https"):
        raise fail(f"scheme {scheme!r} must be http or https")
    prefix = job.get("path_prefix", DEFAULT_PREFIX)
    if not isinstance(prefix, str) or not prefix.startswith("/"):
        raise fail(f"path_prefix {prefix!r} must start with /")
    tenant = job.get("tenant", "")
    if not isinstance(tenant, str):
        raise fail("tenant must be a string")
    if tenant and not is_tenant(tenant):
        raise fail(f"tenant {tenant[:60]!r} is not a tenant id (letters, digits, !-_.*'())")
    token = job.get("bearer_token", "")
    if not isinstance(token, str):
        raise fail("bearer_token must be a string")
    explicit = "profiles" in job
    profiles = _profiles(job.get("profiles", list(DEFAULT_PROFILES)), fail)
    statics = job.get("static_configs")
    if not isinstance(statics, list) or not statics:
        raise fail("static_configs must be a non-empty list of {targets: [...], labels: {...}}")
    out = []
    for s, static in enumerate(statics):
        if not isinstance(static, dict) or set(static) - {"targets", "labels"}:
            raise fail(f"static_configs[{s}] takes targets and labels only")
        hosts = static.get("targets")
        if not isinstance(hosts, list) or not hosts:
            raise fail(f"static_configs[{s}].targets must be a non-empty list of host:port")
        labels = static.get("labels") or {}
        if not isinstance(labels, dict):
            raise fail(f"static_configs[{s}].labels must be a mapping")
        for key, value in labels.items():
            if not isinstance(key, str) or not is_valid_label_name(key):
                raise fail(f"label name {key!r} is not valid")
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise fail(f"label {key!r} must have a string value")
        for host in hosts:
            if not isinstance(host, str) or not _host_port(host):
                raise fail(f"target {host!r} is not host:port")
            series = {SERVICE_NAME: name, "job": name, "instance": host}
            series.update({k: str(v) for k, v in labels.items()})
            out.append(
                Target(
                    job=name,
                    instance=host,
                    scheme=scheme,
                    path_prefix=prefix,
                    labels=tuple(sorted(series.items())),
                    tenant=tenant,
                    interval_s=interval,
                    timeout_s=timeout,
                    profiles=profiles,
                    explicit=explicit,
                    bearer_token=token,
                )
            )
    return out


def _profiles(value: Any, fail: Any) -> Tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise fail(f"profiles must be a non-empty list of {', '.join(PROFILES)}")
    out: List[str] = []
    for item in value:
        name = ALIASES.get(str(item).lower(), str(item).lower())
        if name not in PROFILES:
            raise fail(f"unknown profile {item!r} (use {', '.join(PROFILES)})")
        if name not in out:
            out.append(name)
    return tuple(out)


def _duration(value: Any, default: float, key: str, fail: Any) -> float:
    if value is None:
        return default
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        try:
            seconds = float(text[:-2]) / 1000 if text.endswith("ms") else parse_seconds(text)
        except ValueError:
            seconds = math.nan
    else:
        seconds = math.nan
    if not 0.1 <= seconds <= 86400:  # NaN too
        raise fail(f"{key} {value!r} must be a duration from 100ms to 24h (e.g. 15s)")
    return seconds


def _host_port(text: str) -> bool:
    host, _, port = text.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536 and "/" not in text
