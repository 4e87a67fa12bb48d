"""``hotspan alerts list|get|set|delete``: a server's alert rules and their state.

Talks to ``/api/v1/alerts`` with the standard library only (urllib).  Webhook URLs are shown
with their password and query values redacted, and delivery errors as a status or a kind of
failure, as the server shows them (an older server's answers are cut here too).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List

from hotspan.cli.client import (
    Client,
    CLIError,
    add_server_options,
    path_segment,
    profile_type_id,
    selector_query,
)

EXAMPLES = """\
examples:
  hotspan alerts list
  hotspan alerts set slow-json --file rule.json
  echo '{"selector": "{service_name=\\"api\\"}", "condition": {"kind": "function_share",
        "function": "json\\\\.dumps", "above": 20, "window": "5m"},
        "webhooks": ["http://alertmanager:9093/api/v2/alerts"]}' | hotspan alerts set slow-json
  hotspan alerts get slow-json
  hotspan alerts delete slow-json

a rule's condition is one of:
  {"kind": "function_share", "function": REGEX, "above": PERCENT, "window": "5m"}
  {"kind": "per_request", "increase": PERCENT, "window": "10m", "against": {"offset": "24h"}}
  {"kind": "per_request", "increase": PERCENT, "window": "10m",
   "against": {"label": "version", "baseline": "1.2", "comparison": "1.3"}}
  {"kind": "share_growth", "function": REGEX, "points": PP, "window": "1h",
   "label": "version", "baseline": "1.2", "comparison": "1.3"}
  {"kind": "gil_wait_share", "above": PERCENT, "window": "5m"}
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``hotspan alerts`` and its commands."""
    parser = sub.add_parser(
        "alerts",
        help="list, show, set or delete alert rules (notifications to webhooks)",
        description="Alert rules a server evaluates on profiles; notifications go to webhooks\n"
        "in Alertmanager's format.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="alerts_command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        add_server_options(p)
        p.add_argument("--json", action="store_true", help="print the server's JSON answer")
        p.set_defaults(func=run, log_level="warning")

    common(commands.add_parser("list", help="every rule with its state"))
    get = commands.add_parser("get", help="one rule with its state and history")
    get.add_argument("name")
    common(get)
    put = commands.add_parser("set", help="create or replace a rule from its JSON")
    put.add_argument("name")
    put.add_argument("--file", default="-", help="the rule's JSON file (default: standard input)")
    put.add_argument("--profile-type", help="cpu, wall, ... or a full id (overrides the JSON)")
    common(put)
    delete = commands.add_parser("delete", help="delete a rule")
    delete.add_argument("name")
    common(delete)


def run(args: argparse.Namespace) -> int:
    client = Client.from_args(args)
    command = args.alerts_command
    if command == "list":
        answer = client.json("GET", "/api/v1/alerts")
        if args.json:
            return _print_json(answer)
        _table(answer.get("alerts") or [])
        return 0
    path = "/api/v1/alerts/rules/" + path_segment(args.name, "a rule name")
    if command == "get":
        answer = client.json("GET", path)
        if args.json:
            return _print_json(answer)
        _detail(answer)
        return 0
    if command == "set":
        rule = _read_rule(args)
        answer = client.json("PUT", path, rule)
        if args.json:
            return _print_json(answer)
        print(f"rule {args.name} saved; state {answer.get('state')}")
        return 0
    client.json("DELETE", path)
    if not args.json:
        print(f"rule {args.name} deleted")
    else:
        _print_json({"deleted": args.name})
    return 0


def _read_rule(args: argparse.Namespace) -> Dict[str, Any]:
    try:
        if args.file == "-":
            text = sys.stdin.read()
        else:
            with open(args.file, encoding="utf-8") as f:
                text = f.read()
    except OSError as exc:
        raise CLIError(f"cannot read {args.file}: {exc.strerror}", 2) from None
    try:
        rule = json.loads(text)
    except ValueError as exc:
        where = "standard input" if args.file == "-" else args.file
        raise CLIError(f"{where} is not JSON: {exc}", 2) from None
    if not isinstance(rule, dict):
        raise CLIError("the rule must be a JSON object", 2)
    if args.profile_type:
        rule["profileType"] = profile_type_id(args.profile_type)
    if isinstance(rule.get("selector"), str):
        # Spelled as every other command takes a selector: `shop{env=prod}` too.
        rule["selector"] = selector_query(rule["selector"])
    return rule


def _print_json(answer: Any) -> int:
    print(json.dumps(_redacted(answer), indent=2))
    return 0


def _redacted(answer: Any) -> Any:
    """An answer (an alert, a list of them, or a rule) with webhook URLs redacted, and
    delivery errors cut to their status or kind (an older server kept receivers' bodies)."""
    from hotspan.alerts.rules import redact_rule, redact_url
    from hotspan.alerts.targets import public_error

    if isinstance(answer, list):
        return [_redacted(a) for a in answer]
    if not isinstance(answer, dict):
        return answer
    out = dict(answer)
    if isinstance(out.get("alerts"), list):
        out["alerts"] = _redacted(out["alerts"])
    if isinstance(out.get("rules"), list):
        out["rules"] = [redact_rule(r) if isinstance(r, dict) else r for r in out["rules"]]
    if isinstance(out.get("rule"), dict):
        out["rule"] = redact_rule(out["rule"])
    hooks = out.get("webhooks")
    if isinstance(hooks, list):
        out["webhooks"] = [
            {
                **h,
                "url": redact_url(h["url"]),
                "error": public_error(h["error"])
                if isinstance(h.get("error"), str)
                else h.get("error"),
            }
            if isinstance(h, dict) and isinstance(h.get("url"), str)
            else redact_url(h)
            if isinstance(h, str)
            else h
            for h in hooks
        ]
    return out


def _value(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}"


def _table(alerts: List[Dict[str, Any]]) -> None:
    if not alerts:
        print("no alert rules")
        return
    rows = [("NAME", "STATE", "VALUE", "SINCE", "LAST EVALUATION", "ERROR")]
    for a in alerts:
        rows.append(
            (
                a.get("name") or "",
                a.get("state") or "",
                _value(a.get("value")),
                a.get("since") or "-",
                a.get("lastEvaluation") or "never",
                (a.get("lastError") or "")[:60],
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())


def _detail(alert: Dict[str, Any]) -> None:
    alert = _redacted(alert)
    rule = alert.get("rule") or {}
    print(f"{alert.get('name')}: {alert.get('state')} (value {_value(alert.get('value'))})")
    if alert.get("summary"):
        print(f"  {alert['summary']}")
    print(f"  selector   {rule.get('selector')}  ({rule.get('profileType')})")
    print(f"  condition  {json.dumps(rule.get('condition'))}  for {rule.get('for')}")
    print(f"  last evaluation {alert.get('lastEvaluation') or 'never'}")
    if alert.get("lastError"):
        print(f"  error      {alert['lastError']}")
    if alert.get("generatorURL"):
        print(f"  diff       {alert['generatorURL']}")
    for hook in alert.get("webhooks") or []:
        note = f" (error: {hook['error']})" if hook.get("error") else ""
        print(f"  webhook    {hook['url']}: {hook.get('delivered') or 'nothing sent'}{note}")
    history = alert.get("history") or []
    if history:
        print("  history")
        for h in history:
            print(f"    {h.get('at')}  {h.get('state'):<8}  {_value(h.get('value'))}")
