"""``hotspan view FILE``: lives in :mod:`hotspan.cli.convert`, next to the conversions it uses;
this module is the name COMMANDS imports."""

from hotspan.cli.convert import add_view_parser as add_parser

__all__ = ["add_parser"]
