"""How ``serve --help`` and ``route --help`` read: the essential options first, every option
with its default.

:class:`DefaultsFormatter` appends ``(default X)`` to an option whose help does not already
say its default (a flag's default is ``off``); :func:`essentials_first` moves the options a
first run needs into a group shown before all others. The grouping is argparse's own
(``add_argument_group``); moving an option between groups is done on argparse's group lists,
which ``argparse`` keeps as plain attributes since Python 3.2.
"""

from __future__ import annotations

import argparse

#: Title of the group shown first.
ESSENTIALS = "essential options"


class DefaultsFormatter(argparse.HelpFormatter):
    """Help text that states every option's default (see the module doc)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.required or action.default is argparse.SUPPRESS or "default" in text.lower():
            return text
        return f"{text} (default {describe_default(action)})".lstrip()


def describe_default(action: argparse.Action) -> str:
    """An option's default as the help says it."""
    value = action.default
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        return "off"  # the flag's own effect, not given
    if isinstance(action, argparse.BooleanOptionalAction):
        return "on" if value else "off"
    if value is None or value == []:
        return "none"
    return str(value)


def essentials_first(parser: argparse.ArgumentParser, *flags: str) -> None:
    """Move the options ``flags`` into the :data:`ESSENTIALS` group, shown first."""
    group = parser.add_argument_group(ESSENTIALS)
    parser._action_groups.remove(group)
    parser._action_groups.insert(0, group)
    by_flag = {s: a for a in parser._actions for s in a.option_strings}
    for flag in flags:
        action = by_flag[flag]
        for other in parser._action_groups:
            if action in other._group_actions:
                other._group_actions.remove(action)
        group._group_actions.append(action)
