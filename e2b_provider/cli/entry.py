"""The command line: ``e2b-provider`` (also ``python -m e2b_provider``).

This module is its entry point: it shows the library's warnings as lines of ours, parses the
words (:mod:`.arguments`), runs the command's handler, and turns an error into one line and an
exit status. The handlers sit beside it by what they act on (:mod:`.sandboxes`,
:mod:`.commands`, :mod:`.code`, :mod:`.files`, :mod:`.ports`, :mod:`.local_emulator`; the
terminal of ``exec -it`` and ``shell`` in :mod:`.terminal_session`) and are imported only
when their command runs:
``--help`` and ``--version`` load none of the library, and a Ctrl-C while the command line
starts stays one line. The exit statuses:

* ``exec`` exits with the command's own status, 124 when it timed out, 130 after Ctrl-C
  (once the remote process tree was killed); so does ``logs -f`` once the background
  command ended (130 after Ctrl-C, which leaves the command running);
* ``code`` exits 1 when the code raised (its traceback on stderr), 124 when it timed out,
  130 after Ctrl-C (both once the kernel was interrupted), 0 otherwise;
* 2 for a usage error (a bad option, a word that can be no sandbox name or id, a missing or
  invalid setting);
* 1 for any other error (no such sandbox, an API or connection error, a local file error),
  printed on one line without a traceback;
* 130 after Ctrl-C in any other command, or while it starts (one line: ``e2b-provider:
  interrupted``), except ``port-forward`` and ``forward``, which run until Ctrl-C and then
  exit 0 (as ``kubectl port-forward`` does); ``watch`` exits 130 after Ctrl-C, as ``logs
  -f`` does, and 0 once its ``--timeout`` passed, its directory went, or the reader of its
  output went away (``| head -n 1``: it stops at once, also when no event comes, quietly);
* ``emulator`` exits 0 once Ctrl-C or SIGTERM stopped it, 1 when it cannot run here.

Commands::

    e2b-provider create NAME [--template NAME] [--replace] [--cpu N] [--memory-mb N]
                             [--disk-mb N] [--egress MODE] [--allow-host HOST]...
    e2b-provider exec [-i] [-t] [--timeout S] [-w DIR] [-e K=V]... [-u USER] SANDBOX [CMD [ARG...]]
                             (as docker exec: every word after SANDBOX is the command;
                             our stdin goes to CMD unless it is a terminal, or with -i)
    e2b-provider shell [-w DIR] [-e K=V]... [-u USER] SANDBOX   (as exec -it: the login shell)
    e2b-provider start [--timeout S] [-w DIR] [-e K=V]... [--tag T] [--max-output-bytes N]
                       SANDBOX CMD [ARG...]
    e2b-provider logs [-f] [--tail N] SANDBOX ID
    e2b-provider kill SANDBOX ID
    e2b-provider ps [--no-trunc] SANDBOX
    e2b-provider code [--context ID] [--language L] [--out DIR] [--timeout S]
                      SANDBOX (-c CODE | FILE | -)   (in a code-interpreter-v1 sandbox)
    e2b-provider cp [-r] [--exclude PATTERN]... SRC DST   (one side is SANDBOX:/path;
                                                           - is a tar stream, as docker cp)
    e2b-provider ls [--name NAME]
    e2b-provider ls [-l] [--depth N] SANDBOX:/path
    e2b-provider port-forward [--address A] SANDBOX [LOCAL:]REMOTE...   (until Ctrl-C)
    e2b-provider forward SANDBOX [LOCAL:]PORT [--local-port N]   (until Ctrl-C)
    e2b-provider url SANDBOX PORT
    e2b-provider watch SANDBOX PATH [-r] [--json] [--timeout S]   (until Ctrl-C)
    e2b-provider rm SANDBOX...
    e2b-provider suspend SANDBOX
    e2b-provider resume SANDBOX
    e2b-provider emulator [--host H] [--port N] [--api-key KEY] [--state-dir DIR]
                          [--cpu-count N] [--memory-mb N] [--disk-mb N] [--max-processes N]
                          [--log-level LEVEL] ...  (as python -m e2b_provider.emulator)
"""

# No ``from __future__ import annotations``: it imports ``__future__`` before the ``try``
# below could take a Ctrl-C; the annotations here name what the ``try`` imported.
import sys

try:
    import logging
    from typing import List, Optional, Sequence

    from .arguments import parser
    from .command_words import split_command
    from .exits import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_TIMED_OUT, EXIT_USAGE, PROG, UsageError
except KeyboardInterrupt:  # Ctrl-C while the command line starts: one line, no traceback
    sys.stderr.write("e2b-provider: interrupted\n")
    raise SystemExit(130) from None

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_TIMED_OUT", "EXIT_USAGE", "console_main",
           "main", "parser"]


class _WarningLines(logging.Formatter):
    """The library's warnings as the command line's own lines: ``e2b-provider: warning: ...``."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if text.startswith("e2b_provider: "):
            text = text[len("e2b_provider: "):]
        return f"{PROG}: warning: {text}"


def _show_warnings() -> None:
    lib = logging.getLogger("e2b_provider")
    if not lib.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setLevel(logging.WARNING)
        handler.setFormatter(_WarningLines())
        lib.addHandler(handler)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; returns the exit status."""
    _show_warnings()
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:  # while it starts (parsing, configuration) or waits
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(words: List[str]) -> int:
    p = parser(emulator_options="emulator" in words)
    command = split_command(p, words)  # exec's and start's: every word after SANDBOX
    if command is None and "--" in words:
        p.error("only exec and start take a command (after SANDBOX)")
    args = p.parse_args(words)
    if command is not None:
        args.command = command
    from ..errors import E2BProviderError, InvalidArgument

    try:
        return int(args.func(args))
    except (UsageError, InvalidArgument) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except E2BProviderError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        # stdout closed early (| head): not an error of ours
        sys.stderr.close()
        return EXIT_ERROR
    except OSError as exc:  # a local file (cp, ls) or our own output
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR


def console_main() -> None:  # pragma: no cover - the console-script entry point
    """Entry point of the ``e2b-provider`` console script."""
    sys.exit(main())
