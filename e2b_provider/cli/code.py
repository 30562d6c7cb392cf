"""The ``code`` command: a cell of code run by a sandbox's code interpreter (a Jupyter kernel
that keeps its state between runs), its output shown live, then its text results; its image
results written to ``--out DIR``.

``code`` exits 1 when the code raised (its traceback on stderr, without colour codes), 124
when it timed out (the kernel was interrupted), 130 after Ctrl-C (once the kernel was
interrupted), 0 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional, Tuple, Union

from ..errors import E2BHttpError, E2BProviderError
from ..interpreter.code import no_server
from ..interpreter.results import Execution, Result, strip_ansi
from .arguments import CLI_CODE_TIMEOUT_SECONDS, DEFAULT_EXEC_OUTPUT
from .exits import EXIT_ERROR, EXIT_TIMED_OUT, PROG, UsageError
from .lookup import connect, resolve
from .output import writer

#: The template whose sandboxes have a code interpreter.
CODE_TEMPLATE = "code-interpreter-v1"
#: The image formats of a result written to ``--out``, and their files' extensions.
_IMAGES = (("png", "png"), ("jpeg", "jpg"), ("svg", "svg"), ("pdf", "pdf"))


def cmd_code(args: argparse.Namespace) -> int:
    """``code``: run code in the sandbox's code interpreter, its output streamed live."""
    if args.context is not None and args.language is not None:
        raise UsageError("give --context or --language, not both (a context has its language)")
    code = _the_code(args.code, args.file)
    timeout = CLI_CODE_TIMEOUT_SECONDS if args.timeout is None else args.timeout
    with connect() as p:
        h = resolve(p, args.sandbox)
        if args.out is not None:
            os.makedirs(args.out, exist_ok=True)
        try:
            ex = p.run_code(
                h,
                code,
                language=args.language or "python",
                context=args.context,
                timeout=timeout,
                max_output_bytes=DEFAULT_EXEC_OUTPUT,
                on_stdout=writer(sys.stdout),
                on_stderr=writer(sys.stderr),
            )
        except E2BHttpError as exc:
            if no_server(exc):
                raise E2BProviderError(
                    f"sandbox {args.sandbox} has no code interpreter (nothing listens on its "
                    f"port 49999): create one from the template {CODE_TEMPLATE!r}: "
                    f"{PROG} create NAME --template {CODE_TEMPLATE}"
                ) from None
            raise
    _show(ex, args.out)
    return _status(ex, timeout)


def _the_code(inline: Optional[str], file: Optional[str]) -> str:
    """The code of ``-c CODE``, of ``FILE``, or of standard input (``-``)."""
    if (inline is None) == (file is None):
        raise UsageError("code takes its code from one of -c CODE, FILE or - (standard input)")
    if inline is not None:
        return inline
    if file == "-":
        data, where = sys.stdin.buffer.read(), "standard input"
    else:
        assert file is not None
        with open(file, "rb") as f:
            data, where = f.read(), file
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise E2BProviderError(f"{where}: not UTF-8 text") from None


def _show(ex: Execution, out: Optional[str]) -> None:
    """The text results on stdout, in order (the cell's value, and each displayed one that is
    no image); the image results written to ``out``, one line each on stderr."""
    images: List[Result] = []
    for result in ex.results:
        image = any(getattr(result, name) is not None for name, _ in _IMAGES)
        if image:
            images.append(result)
        if result.text is not None and (result.is_main_result or not image):
            print(result.text, flush=True)
    if not images:
        return
    if out is None:
        n = len(images)
        print(f"{PROG}: {n} image result{'' if n == 1 else 's'} not written (use --out DIR)",
              file=sys.stderr)
        return
    cell = "" if ex.execution_count is None else f"-{ex.execution_count}"
    for i, result in enumerate(images, start=1):
        for data, ext in _images_of(result):
            path = os.path.join(out, f"result{cell}-{i}.{ext}")
            with open(path, "wb") as f:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
            print(f"wrote {path}", file=sys.stderr)


def _images_of(result: Result) -> List[Tuple[Union[str, bytes], str]]:
    """``(data, file extension)`` of each image the result has (an SVG is text)."""
    return [(getattr(result, name), ext) for name, ext in _IMAGES
            if getattr(result, name) is not None]


def _status(ex: Execution, timeout: float) -> int:
    """The exit status of the run, saying why on stderr when it is not 0."""
    if ex.truncated:
        print(f"{PROG}: output past {DEFAULT_EXEC_OUTPUT} bytes was dropped", file=sys.stderr)
    kept = ("the kernel did not stop and was restarted: its variables are lost"
            if ex.restarted else "the kernel was interrupted; its variables are kept")
    if ex.timed_out:
        print(f"{PROG}: timed out after {timeout:g} s ({kept})", file=sys.stderr)
        return EXIT_TIMED_OUT
    if ex.cancelled:
        print(f"{PROG}: the code was stopped ({kept})", file=sys.stderr)
        return EXIT_ERROR
    if ex.error is not None:
        trace = strip_ansi(ex.error.traceback).rstrip("\n") or str(ex.error)
        print(trace, file=sys.stderr)
        return EXIT_ERROR
    return 0
