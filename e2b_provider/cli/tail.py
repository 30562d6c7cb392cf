"""``logs --tail N``: the last lines of a background command's output, and (with ``-f``) what
comes after them.

``logs --tail N -f`` reads the output the sandbox keeps, prints its last ``N`` lines, then
follows the command. Following replays the output kept before the live output (see
:meth:`~e2b_provider.commands.command.Command.wait`); :class:`AfterShown` drops that
replay, so each line is shown once, as ``docker logs --tail N -f`` shows it. The replay
is the output kept when the follow began: the output read before, or, when the sandbox
had to drop the oldest output meanwhile (past ``--max-output-bytes``), its end followed
by what came since; :func:`overlap` finds where the two meet.
"""

from __future__ import annotations

from typing import Callable, Optional

#: The first characters of what follows a replay, looked for in the output read before.
_ANCHOR = 64


def last_lines(text: str, n: Optional[int]) -> str:
    """The last ``n`` lines of ``text`` (None: all of it), as ``tail -n`` counts them: a
    last line without its newline is one."""
    if n is None:
        return text
    cut = len(text) - 1 if text.endswith("\n") else len(text)
    for _ in range(n):
        cut = text.rfind("\n", 0, cut)
        if cut < 0:
            return text
    return text[cut + 1 :]


def overlap(shown: str, replay: str) -> int:
    """How many characters at the start of ``replay`` are the end of ``shown``: the longest
    end of ``shown`` that ``replay`` starts with (0 when none)."""
    if replay.startswith(shown):  # nothing was dropped meanwhile: the usual case
        return len(shown)
    anchor = replay[:_ANCHOR]
    start = 1
    while anchor:
        d = shown.find(anchor, start)
        if d < 0:
            break
        if shown.startswith(replay[: len(shown) - d], d):
            return len(shown) - d
        start = d + 1
    # an end of ``shown`` shorter than the anchor
    for d in range(max(start, len(shown) - len(anchor) + 1), len(shown)):
        if replay.startswith(shown[d:]):
            return len(shown) - d
    return 0


class AfterShown:
    """A live-output callback for ``wait`` that passes on only what comes after ``shown``
    (the output of the stream read before and already dealt with): the start of what it is
    given is held until it is at least as long as ``shown``, then the replay of ``shown``
    is dropped (:func:`overlap`) and the rest goes to ``out``, as does all that follows.
    Call :meth:`finish` once the wait returned."""

    def __init__(self, shown: str, out: Callable[[str], None]) -> None:
        self._shown = shown
        self._out = out
        self._held: Optional[str] = "" if shown else None

    def __call__(self, text: str) -> None:
        if self._held is None:
            self._out(text)
            return
        self._held += text
        if len(self._held) >= len(self._shown):
            self.finish()

    def finish(self) -> None:
        """Pass on what is held past the replay (the stream ended, or it is long enough)."""
        held, self._held = self._held, None
        if held is None:
            return
        rest = held[overlap(self._shown, held) :]
        if rest:
            self._out(rest)
