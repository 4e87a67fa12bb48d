"""``hotspan tokens create|list|revoke``: a tenant's API tokens on a server.

Talks to ``/api/v1/tokens`` with the standard library only (urllib), with an admin token of
the tenant or the server's query token (``--token``); ``--tenant`` names the tenant.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Dict, List

from hotspan.cli.client import Client, CLIError, add_server_options, path_segment

ROLES = ("ingest", "query", "admin")

EXAMPLES = """\
examples:
  hotspan tokens create --tenant team-a --role admin --token $OPERATOR_QUERY_TOKEN
  hotspan tokens create --tenant team-a --role ingest --name ci-agents --token $ADMIN_TOKEN
  hotspan tokens list --tenant team-a --token $ADMIN_TOKEN
  hotspan tokens revoke 3f2a9c0d1e4b5a69 --tenant team-a --token $ADMIN_TOKEN

roles:
  ingest   pushes profiles and spans of the tenant (agents, SDKs, collectors)
  query    reads the tenant's data (Grafana, the UI, hotspan query)
  admin    both, and changes the tenant's alert and recording rules, settings and tokens
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``hotspan tokens`` and its commands."""
    parser = sub.add_parser(
        "tokens",
        help="create, list or revoke a tenant's API tokens",
        description="A tenant's API tokens: each lets its holder ingest, query or administer\n"
        "that tenant only.  A token is shown once, when it is created; the server keeps\n"
        "its hash.  --token is an admin token of the tenant or the server's query token.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="tokens_command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        add_server_options(p)
        p.add_argument("--json", action="store_true", help="print the server's JSON answer")
        p.set_defaults(func=run, log_level="warning")

    create = commands.add_parser("create", help="a new token (printed once)")
    create.add_argument("--role", required=True, choices=ROLES, help="what the token may do")
    create.add_argument("--name", default="", help="what the token is for (shown in list)")
    common(create)
    common(commands.add_parser("list", help="the tenant's tokens (never their values)"))
    revoke = commands.add_parser("revoke", help="revoke a token by its id")
    revoke.add_argument("id", help="the token's id, as list shows it")
    common(revoke)


def run(args: argparse.Namespace) -> int:
    client = Client.from_args(args)
    command = args.tokens_command
    if command == "create":
        answer = client.json("POST", "/api/v1/tokens", {"role": args.role, "name": args.name}) or {}
        if args.json:
            print(json.dumps(answer, indent=2))
            return 0
        if not all(isinstance(answer.get(k), str) for k in ("token", "id", "tenant", "role")):
            raise CLIError("the server's answer has no token: is --server a hotspan server?")
        print(answer["token"])
        print(
            f"token {answer['id']} of tenant {answer['tenant']} ({answer['role']}): "
            "save it now, it is not shown again",
            file=sys.stderr,
        )
        return 0
    if command == "list":
        answer = client.json("GET", "/api/v1/tokens")
        if args.json:
            print(json.dumps(answer, indent=2))
            return 0
        _table(answer.get("tokens") or [])
        return 0
    answer = client.json("DELETE", "/api/v1/tokens/" + path_segment(args.id, "a token id"))
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        print(f"token {args.id} revoked")
    return 0


def _created(ns: Any) -> str:
    if not isinstance(ns, int) or ns <= 0:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ns / 1e9)) + "Z"


def _table(tokens: List[Dict[str, Any]]) -> None:
    if not tokens:
        print("no tokens")
        return
    rows = [("ID", "TENANT", "ROLE", "CREATED", "NAME")]
    for t in tokens:
        rows.append(
            (
                str(t.get("id", "")),
                str(t.get("tenant", "")),
                str(t.get("role", "")),
                _created(t.get("created_at")),
                str(t.get("name") or ""),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
