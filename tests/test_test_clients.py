"""The suite's own HTTP clients share one TLS context (``tests/helpers.TLS``): httpx loads the
CA bundle for each client it makes otherwise (~40 ms of CPU), and the suite makes thousands,
which once took more than a quarter of its workers' CPU (docs/development.md)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import List

TESTS = Path(__file__).resolve().parent
# httpx's functions and classes that make a client of their own.
MAKE_A_CLIENT = {
    "get",
    "post",
    "put",
    "patch",
    "delete",
    "head",
    "options",
    "request",
    "stream",
    "Client",
    "AsyncClient",
}


def clients_without_shared_tls(source: str) -> List[int]:
    """The lines of ``httpx.<call>(...)`` that make a client and pass no ``verify``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "httpx"
            and node.func.attr in MAKE_A_CLIENT
            # ``**kwargs`` may carry it (RunningServer.client sets it there).
            and not any(k.arg in ("verify", None) for k in node.keywords)
        ):
            lines.append(node.lineno)
    return lines


def test_the_checker_finds_a_client_without_verify() -> None:
    source = (
        "import httpx\nhttpx.get(u)\nhttpx.get(u, verify=TLS)\nwith httpx.Client() as c: pass\n"
    )
    assert clients_without_shared_tls(source) == [2, 4]


def test_every_test_client_shares_the_tls_context() -> None:
    found = [
        f"{path.relative_to(TESTS.parent)}:{line}"
        for path in sorted(TESTS.rglob("*.py"))
        for line in clients_without_shared_tls(path.read_text())
    ]
    assert found == [], "pass verify=TLS (tests/helpers.py) to these: " + ", ".join(found)
