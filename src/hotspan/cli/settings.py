"""``hotspan settings get|set|delete``: the server's live agent settings from a terminal.

Talks to ``/api/v1/settings`` with the standard library only (urllib), so it runs wherever
hotspan is installed.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.parse
from typing import Any, Dict, List, Optional, Sequence

from hotspan.cli.client import Client, CLIError, add_server_options
from hotspan.model.agent_settings import SettingsError, validate_settings

EXAMPLES = """\
examples:
  hotspan settings get checkout
  hotspan settings set checkout --rate 50 --types cpu,wall
  hotspan settings set checkout --selector '{env="prod"}' --disable
  hotspan settings delete checkout --selector '{env="prod"}'
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``hotspan settings`` and its three commands."""
    parser = sub.add_parser(
        "settings",
        help="show or change the live settings agents follow (per service)",
        description="The rules a server gives the agents of a service, and what its\n"
        "instances report (rate, overhead, which rule they follow).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="settings_command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("service", help="the service (service_name) the settings are for")
        add_server_options(p)
        p.add_argument("--json", action="store_true", help="print the server's JSON answer")
        p.set_defaults(func=run, log_level="warning")

    get = commands.add_parser("get", help="rules of a service and its instances")
    common(get)

    put = commands.add_parser(
        "set",
        help="set settings for a service's instances (merged into the rule's current ones)",
    )
    common(put)
    put.add_argument("--selector", default="", help='only instances matching {env="prod"}')
    on = put.add_mutually_exclusive_group()
    on.add_argument(
        "--enable", dest="enabled", action="store_const", const=True, help="profiling on"
    )
    on.add_argument(
        "--disable", dest="enabled", action="store_const", const=False, help="profiling off"
    )
    put.add_argument("--rate", dest="sample_rate", type=int, metavar="HZ", help="sample rate")
    put.add_argument(
        "--types", dest="profile_types", metavar="LIST", help="profile types: cpu,wall,..."
    )
    put.add_argument("--alloc-sample-bytes", type=int, metavar="N", help="0: off")
    put.add_argument(
        "--conditional-only",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep only samples of slow, failed or CPU-heavy requests",
    )
    put.add_argument("--slow-request-threshold", type=float, metavar="S", help="seconds (0: off)")
    put.add_argument("--max-overhead", type=float, metavar="P", help="percent of the process's CPU")
    put.add_argument(
        "--replace",
        action="store_true",
        help="replace the rule's settings instead of merging into them",
    )

    delete = commands.add_parser("delete", help="delete the rule of a service and selector")
    common(delete)
    delete.add_argument("--selector", default="", help="the rule's selector (default: none)")


def run(args: argparse.Namespace) -> int:
    client = _Client(args.server, args.token, args.tenant)
    return {"get": _get, "set": _set, "delete": _delete}[args.settings_command](client, args)


class _Client:
    """The settings API of one server."""

    def __init__(self, server: str, token: Optional[str], tenant: Optional[str]) -> None:
        self.http = Client(server, token, tenant)

    def call(self, method: str, service: str, body: Optional[dict] = None, query: str = "") -> Any:
        path = f"/api/v1/settings/{urllib.parse.quote(service, safe='')}"
        return self.http.json(method, path, body, dict(urllib.parse.parse_qsl(query)))


def _selector(text: str) -> str:
    # The server's canonical spelling, so that the rule to merge into is found by its text.
    from hotspan.model.labels import SelectorError
    from hotspan.model.settings_rules import normalize_selector

    try:
        return normalize_selector(text)
    except SelectorError as exc:
        raise CLIError(f"bad --selector {text!r}: {exc}", 2) from None


def _wanted(args: argparse.Namespace) -> Dict[str, Any]:
    wanted: Dict[str, Any] = {}
    for name in (
        "enabled",
        "sample_rate",
        "alloc_sample_bytes",
        "conditional_only",
        "slow_request_threshold",
        "max_overhead",
    ):
        value = getattr(args, name)
        if value is not None:
            wanted[name] = value
    if args.profile_types is not None:
        wanted["profile_types"] = [t.strip() for t in args.profile_types.split(",") if t.strip()]
    if not wanted and not args.replace:
        raise CLIError("nothing to set: give at least one setting, such as --rate 50", 2)
    try:
        return validate_settings(wanted)
    except SettingsError as exc:
        raise CLIError(str(exc), 2) from None


def _set(client: _Client, args: argparse.Namespace) -> int:
    selector = _selector(args.selector)
    settings = _wanted(args)
    if not args.replace:
        current = client.call("GET", args.service)
        for rule in current.get("rules", []):
            if rule.get("selector") == selector:
                settings = {**rule.get("settings", {}), **settings}
    rule = client.call("PUT", args.service, {"selector": selector, "settings": settings})
    if args.json:
        print(json.dumps(rule, indent=2))
    else:
        print(
            f"{args.service} {_shown(rule['selector'])}: version {rule['version']}, "
            f"{_settings_text(rule['settings'])}"
        )
    return 0


def _delete(client: _Client, args: argparse.Namespace) -> int:
    selector = _selector(args.selector)
    answer = client.call(
        "DELETE", args.service, query=urllib.parse.urlencode({"selector": selector})
    )
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        print(f"{args.service} {_shown(selector)}: rule deleted")
    return 0


def _get(client: _Client, args: argparse.Namespace) -> int:
    answer = client.call("GET", args.service)
    if args.json:
        print(json.dumps(answer, indent=2))
        return 0
    rules = answer.get("rules", [])
    instances = answer.get("instances", [])
    if rules:
        print(f"Rules of {args.service}:")
        _table(
            ["SELECTOR", "VERSION", "UPDATED", "SETTINGS"],
            [
                [
                    _shown(r["selector"]),
                    str(r["version"]),
                    time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["updated_at"] / 1e9)),
                    _settings_text(r["settings"]),
                ]
                for r in rules
            ],
        )
    else:
        print(f"No rules for {args.service}: its agents follow their own configuration.")
    print()
    if not instances:
        print("No instance seen in the last 10 minutes.")
        return 0
    print(f"Instances seen in the last 10 minutes ({len(instances)}):")
    now = time.time_ns()
    rows = []
    for inst in instances:
        status = inst.get("status") or {}
        rows.append(
            [
                inst["instance"],
                "-" if inst["rule_selector"] is None else _shown(inst["rule_selector"]),
                f"{status.get('settings_version', '?')}/{inst['expected_version']}",
                "stopped" if inst.get("stopped") else "yes" if inst["follows"] else "NO",
                _yes_no(status.get("enabled")),
                str(status.get("sample_rate", "?")),
                _percent(status.get("overhead")) + " / " + _percent(status.get("max_overhead")),
                str(status.get("rate_reason") or "-"),
                f"{max(0, now - inst['last_seen']) / 1e9:.0f}s ago",
            ]
        )
    _table(
        [
            "INSTANCE",
            "RULE",
            "APPLIED/EXPECTED",
            "FOLLOWS",
            "ENABLED",
            "RATE",
            "OVERHEAD/MAX",
            "REASON",
            "LAST SEEN",
        ],
        rows,
    )
    return 0


def _shown(selector: str) -> str:
    return selector or "(all instances)"


def _settings_text(settings: Dict[str, Any]) -> str:
    if not settings:
        return "(none: the agents' own configuration)"
    return ", ".join(f"{k}={_value(v)}" for k, v in sorted(settings.items()))


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def _yes_no(value: Any) -> str:
    return "?" if value is None else ("yes" if value else "no")


def _percent(value: Any) -> str:
    return f"{value:.2f}%" if isinstance(value, (int, float)) else "?"


def _table(header: Sequence[str], rows: List[List[str]]) -> None:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    for row in [list(header), *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
