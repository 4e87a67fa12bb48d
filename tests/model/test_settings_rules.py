"""Which live-settings rule an agent follows, and a rule selector's one spelling, shared by
the server and ``hotspan settings`` (hotspan.model.settings_rules), on the store's own rules;
and the command line spells a selector without loading the server."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hotspan.model.labels import SelectorError
from hotspan.model.settings_rules import MAX_SELECTOR_CHARS, matching_rule, normalize_selector
from hotspan.store.base import SettingsRule


def rule(selector: str, version: int) -> SettingsRule:
    return SettingsRule("api", selector, {"sample_rate": version}, version, 0)


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("", ""),
        ("{}", ""),
        ('{region="eu",env="prod"}', '{env="prod", region="eu"}'),
        ('{ env = "prod" , env="prod" }', '{env="prod"}'),
        ('{pod=~"web-.*", env!="dev"}', '{env!="dev", pod=~"web-.*"}'),
    ],
)
def test_one_spelling_per_selector(text: str, canonical: str) -> None:
    assert normalize_selector(text) == canonical
    assert normalize_selector(canonical) == canonical


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('app{env="x"}', "labels only"),
        ("{env=prod", "expected a quoted value"),
        ("{" + "a" * MAX_SELECTOR_CHARS + "}", f"longer than {MAX_SELECTOR_CHARS}"),
    ],
)
def test_what_is_not_a_settings_selector(text: str, message: str) -> None:
    with pytest.raises(SelectorError, match=message):
        normalize_selector(text)


def test_the_most_specific_rule_wins_then_the_newest() -> None:
    everyone = rule("", 1)
    prod = rule('{env="prod"}', 2)
    prod_eu = rule('{env="prod", region="eu"}', 3)
    prod_again = rule('{region!="us"}', 4)
    rules = [prod_eu, prod, everyone, prod_again]
    assert matching_rule(rules, {"env": "prod", "region": "eu"}) is prod_eu
    # Two one-matcher rules match: the higher version wins.
    assert matching_rule(rules, {"env": "prod", "region": "ap"}) is prod_again
    assert matching_rule(rules, {"env": "dev", "region": "us"}) is everyone
    assert matching_rule([prod], {"env": "dev"}) is None


def test_a_stored_selector_that_does_not_parse_matches_nothing() -> None:
    assert matching_rule([rule("{env=", 9)], {"env": "prod"}) is None


def test_the_command_line_spells_selectors_without_the_server() -> None:
    code = (
        "import sys\n"
        "from hotspan.cli import settings\n"
        'print(settings._selector(\'{b="2",a="1"}\'))\n'
        "print(sorted(m for m in sys.modules if m.startswith('hotspan.server')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.splitlines() == ['{a="1", b="2"}', "[]"]
