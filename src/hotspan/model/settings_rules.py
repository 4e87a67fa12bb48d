"""Which live-settings rule an agent follows: a rule's selector in its one canonical spelling,
and the match of an agent's labels against the rules of its service.

The server answers agents with it and ``hotspan settings`` spells selectors with it, so that a
rule the command line names is the rule the server stores.  Kept apart from
``model.agent_settings``, which the agent imports: selectors need ``model.labels`` (regular
expressions, RE2), which the agent never loads.
"""

from __future__ import annotations

import functools
from typing import Iterable, Mapping, Optional, Protocol, TypeVar

from hotspan.model.labels import Selector, SelectorError, parse_selector

MAX_SELECTOR_CHARS = 1000


class Rule(Protocol):
    """What matching reads of a rule (the store's ``SettingsRule`` is one)."""

    @property
    def selector(self) -> str: ...

    @property
    def version(self) -> int: ...


R = TypeVar("R", bound=Rule)


def normalize_selector(text: str) -> str:
    """The canonical form of a rule's selector: ``""`` or ``{a="1", b!="2"}`` (matchers
    sorted, spacing and quoting fixed), so that one rule has one spelling.  SelectorError
    when it is not a label selector."""
    text = text or ""
    if len(text) > MAX_SELECTOR_CHARS:
        raise SelectorError(f"longer than {MAX_SELECTOR_CHARS} characters")
    sel = parse_selector(text)
    if sel.metric:
        raise SelectorError(
            f'a settings selector has labels only ({{env="prod"}}), not {sel.metric!r}'
        )
    if not sel.matchers:
        return ""
    return "{" + ", ".join(sorted({str(m) for m in sel.matchers})) + "}"


@functools.lru_cache(maxsize=4096)
def _parsed(selector: str) -> Optional[Selector]:
    try:
        return parse_selector(selector)
    except SelectorError:
        return None  # stored by an older server or another backend: it matches nothing


def matching_rule(rules: Iterable[R], labels: Mapping[str, str]) -> Optional[R]:
    """The rule an agent with these labels follows: of the rules whose selector matches,
    the one with the most matchers, ties to the most recently changed (highest version)."""
    best: Optional[R] = None
    best_key = (-1, -1)
    for rule in rules:
        sel = _parsed(rule.selector)
        if sel is None or not sel.matches(labels):
            continue
        key = (len(sel.matchers), rule.version)
        if key > best_key:
            best, best_key = rule, key
    return best
