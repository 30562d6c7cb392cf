"""The words of ``exec`` and ``start`` as ``docker exec`` reads them: options, SANDBOX, then
the command, every word after SANDBOX (also one that looks like an option).

argparse cannot tell where the command starts (its sub-commands do not pass ``--`` on, and a
word such as ``-l`` after SANDBOX would be taken for an option of ours), so the command's
words are split off here, before parsing, by the options each sub-command declares.
Standard library only, as :mod:`.arguments`.
"""

from __future__ import annotations

import argparse
from typing import List, Optional

__all__ = ["COMMAND_TAKERS", "split_command"]

#: The commands whose words after SANDBOX are the command to run (see :func:`split_command`).
COMMAND_TAKERS = ("exec", "start")


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def _values(sub: argparse.ArgumentParser, word: str) -> int:
    """How many words after the option ``word`` of ``sub`` (or a cluster of short ones,
    ``-it``, ``-eK=V``) are its value: 0 or 1. An unknown option takes none (argparse then
    says it is unknown)."""
    known = sub._option_string_actions
    if word.startswith("--"):
        name = word.partition("=")[0]
        action = known.get(name)
        if action is None:  # a unique prefix, as argparse takes one
            found = [a for o, a in known.items() if o.startswith("--") and o.startswith(name)]
            action = found[0] if len({id(a) for a in found}) == 1 else None
        return int(action is not None and "=" not in word and _takes_value(action))
    for i, letter in enumerate(word[1:], start=1):
        action = known.get("-" + letter)
        if action is None:
            return 0
        if _takes_value(action):
            return int(i == len(word) - 1)  # its value attached, or the next word
    return 0


def split_command(p: argparse.ArgumentParser, words: List[str]) -> Optional[List[str]]:
    """For ``exec`` and ``start``, as ``docker exec`` reads its words: the options come
    before SANDBOX, and every word after SANDBOX is the command (``exec SB ls -l /tmp``).
    ``--`` is still taken: before SANDBOX it ends the options; right after SANDBOX it is
    dropped (``exec SB -- ls -l``). Options after SANDBOX, ended by ``--`` (``exec SB
    --cwd /tmp -- ls``), are taken as before too: a command does not start with ``-``.

    Removes the command's words from ``words`` (in place) and returns them; None when
    ``words`` is not one of these commands (their words stay for argparse as they are).
    """
    i = 0
    while i < len(words) and words[i].startswith("-") and words[i] != "--":
        i += 1  # options of the program itself (--version, -h): they take no value
    if i >= len(words) or words[i] not in COMMAND_TAKERS:
        return None
    sub = _subparser(p, words[i])
    i += 1
    while i < len(words):
        word = words[i]
        if word == "--":
            del words[i]
            break
        if not word.startswith("-") or word == "-":
            break
        i += 1 + _values(sub, word)
    if i >= len(words):
        return []
    i += 1  # SANDBOX
    rest = words[i:]
    del words[i:]
    if rest[:1] == ["--"]:
        return rest[1:]
    if rest and rest[0].startswith("-") and rest[0] != "-":
        # the older form: options after SANDBOX, then -- and the command
        cut = rest.index("--") if "--" in rest else len(rest)
        words.extend(rest[:cut])
        return rest[cut + 1:]
    return rest


def _subparser(p: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser = action.choices[name]
            return found
    raise KeyError(name)  # pragma: no cover - every parser here has its sub-commands


