"""A merged profile from a server, as the client commands (query, export, diff) fetch it, and
what to tell a user whose selector matched nothing.

The profile comes from the querier's ``SelectMergeProfile`` (a pprof of every stack in the
range), so every command holds the same numbers as ``go tool pprof`` on an export.
"""

from __future__ import annotations

import argparse
import json
from typing import Callable, List, Optional, Sequence

from hotspan.cli.client import (
    PROFILE_TYPE_ALIASES,
    Client,
    CLIError,
    TimeRange,
    selector_query,
)
from hotspan.cli.output import iso
from hotspan.model.stack_profile import StackProfile

QUERIER = "/querier.v1.QuerierService"


def add_profile_type_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profile-type",
        default="cpu",
        metavar="TYPE",
        help=f"{', '.join(PROFILE_TYPE_ALIASES)}, or a full profile type id (default cpu)",
    )


def type_name(type_id: str) -> str:
    """The short name a user types for a profile type id (``cpu``), or the id itself."""
    for alias, full in PROFILE_TYPE_ALIASES.items():
        if full == type_id:
            return alias
    return type_id


def types_of(client: Client, query: str, window: TimeRange) -> List[str]:
    """The profile type ids the selector ``query`` has series of in the range."""
    from hotspan.model.labels import PROFILE_TYPE

    span = {"start": str(window.start_ms), "end": str(window.end_ms)}
    found = client.json(
        "POST", f"{QUERIER}/Series", {"matchers": [query], "labelNames": [PROFILE_TYPE], **span}
    )
    return sorted(
        {
            pair["value"]
            for labels in (found or {}).get("labelsSet", [])
            for pair in labels.get("labels", [])
            if pair.get("name") == PROFILE_TYPE
        }
    )


def resolve_type(client: Client, typed: str, type_id: str, query: str, window: TimeRange) -> str:
    """The profile type id for ``--profile-type`` (``typed``, read as ``type_id`` by
    profile_type_id): an alias names a sample type and unit, which SDKs file under types of
    their own (Node's CPU time is ``wall:cpu:nanoseconds:wall:nanoseconds``, its live heap's
    period ``inuse_space``): the alias's usual id when the selector has it, else the
    selector's type of that sample type and unit, else the usual id (and the hint of what
    exists comes later)."""
    if typed.strip() not in PROFILE_TYPE_ALIASES:
        return type_id
    wanted = type_id.split(":")[1:3]
    try:
        present = types_of(client, query, window)
    except CLIError:
        return type_id
    if type_id in present:
        return type_id
    alike = [t for t in present if t.split(":")[1:3] == wanted]
    return alike[0] if alike else type_id


def fetch_profile(
    client: Client,
    query: str,
    type_id: str,
    window: TimeRange,
    progress: Optional[Callable[[int, Optional[int]], None]] = None,
    typed: str = "",
) -> StackProfile:
    """The merged profile of ``query`` (the server's selector; ``typed``: as the user wrote
    it); CLIError naming what does exist when nothing matches."""
    from hotspan.formats.errors import FormatError
    from hotspan.formats.pprof import read_stack_profile
    from hotspan.formats.proto import querier_pb2

    request = querier_pb2.SelectMergeProfileRequest(
        profile_typeID=type_id, label_selector=query, start=window.start_ms, end=window.end_ms
    )
    body = client.bytes(
        "POST",
        f"{QUERIER}/SelectMergeProfile",
        request.SerializeToString(),
        headers={"Content-Type": "application/proto", "Accept": "application/proto"},
        progress=progress,
    )
    try:
        profile = read_stack_profile(body)
    except FormatError as exc:
        raise CLIError(f"the answer of {client.server} is not a pprof profile: {exc}") from None
    if not profile.sample_types or profile.total(0) <= 0:
        shown = f"{typed} ({query})" if typed and typed != query else query
        name = type_name(type_id)
        raise CLIError(
            f"no {name} samples for {shown} from {iso(window.start_ms)} to "
            f"{iso(window.end_ms)}{f' ({type_id})' if name != type_id else ''}; "
            + what_exists(client, query, type_id, window)
        )
    return profile


def what_exists(client: Client, query: str, type_id: str, window: TimeRange) -> str:
    """A hint for a selector without samples: the profile types it has in that range, or else
    the values its labels have there, or else the services there are."""
    from hotspan.model.labels import SERVICE_NAME, parse_selector

    span = {"start": str(window.start_ms), "end": str(window.end_ms)}
    try:
        types = types_of(client, query, window)
        if types:
            return f"it has: {', '.join(type_name(t) for t in types)}"
        matchers = parse_selector(query).matchers
        service = next((m.value for m in matchers if m.name == SERVICE_NAME and m.op == "="), None)
        services = _label_values(client, SERVICE_NAME, [], span)
        if service is None or service not in services:
            if not services:
                return "the server has no profiles at all in that range"
            return f"services with profiles in that range: {', '.join(services[:20])}"
        scope = [selector_query(f"{{{SERVICE_NAME}={json.dumps(service)}}}")]
        hints = []
        for m in matchers:
            if m.name != SERVICE_NAME:
                values = _label_values(client, m.name, scope, span)
                hints.append(f"{service} has {m.name}: {', '.join(values[:20]) or 'none'}")
        return "; ".join(hints) or f"{service} has no {type_name(type_id)} profiles there"
    except CLIError as exc:
        return f"(what exists is unknown: {exc})"


def _label_values(client: Client, name: str, matchers: Sequence[str], span: dict) -> List[str]:
    found = client.json(
        "POST", f"{QUERIER}/LabelValues", {"name": name, "matchers": list(matchers), **span}
    )
    return sorted((found or {}).get("names", []))
