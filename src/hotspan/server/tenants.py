"""What may name a tenant: the ``X-Scope-OrgID`` values requests send, and the tenants that
tokens and scrape jobs are given."""

from __future__ import annotations

import re

# The characters Cortex/Mimir/Pyroscope accept in a tenant id.
_TENANT = re.compile(r"[a-zA-Z0-9!\-_.*'()]{1,150}")


def is_tenant(text: str) -> bool:
    """Whether ``text`` may name a tenant."""
    return bool(_TENANT.fullmatch(text)) and text not in (".", "..")
