"""The requests of the agent's ``process.Process`` service, validated as envd decodes them.

This module owns what a ``Start`` asks for (:class:`StartSpec`, echoed by ``List``), the
``ProcessSelector`` of the other calls (a pid or a tag), the signals ``SendSignal`` accepts,
the ``PTY`` size of ``Start`` and ``Update``, and the ``input`` of ``SendInput``; each bad
value is the :class:`~.rpc.RpcError` envd answers. Pure: no I/O.
"""

from __future__ import annotations

import signal
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import attrs

from .rpc import RpcError, decode_b64

__all__ = [
    "Selector",
    "StartSpec",
    "decode_input",
    "parse_pty_size",
    "parse_selector",
    "parse_signal",
    "parse_start_request",
]

_SIGNALS_BY_NAME: Mapping[str, int] = {
    "SIGNAL_SIGKILL": int(signal.SIGKILL),
    "SIGNAL_SIGTERM": int(signal.SIGTERM),
}


@attrs.frozen
class StartSpec:
    """A validated ``StartRequest``: what to run, and the config echoed by ``List``."""

    cmd: str
    args: Tuple[str, ...] = ()
    envs: Mapping[str, str] = attrs.field(factory=dict)
    cwd: Optional[str] = None
    tag: Optional[str] = None
    stdin: bool = True
    pty: Optional[Tuple[int, int]] = None  # (cols, rows)

    def config_json(self) -> Dict[str, Any]:
        """``ProcessConfig`` as envd echoes it: the request's own values, proto3 omissions."""
        config: Dict[str, Any] = {}
        if self.cmd:
            config["cmd"] = self.cmd
        if self.args:
            config["args"] = list(self.args)
        if self.envs:
            config["envs"] = dict(self.envs)
        if self.cwd is not None:
            config["cwd"] = self.cwd
        return config


def _bad(message: str) -> RpcError:
    return RpcError("invalid_argument", f"unmarshal message: {message}")


def _uint(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise _bad(f"{what} is not an integer")
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if not isinstance(value, int) or value < 0 or value > 0xFFFFFFFF:
        raise _bad(f"{what} is not an unsigned 32-bit integer")
    return value


def parse_pty_size(pty_obj: Any) -> Optional[Tuple[int, int]]:
    """The ``(cols, rows)`` of a ``PTY`` message (``None`` when unset), as uint32 values.

    Raises:
        RpcError: ``invalid_argument`` for a value that is not an object or a uint32.
    """
    if pty_obj is None:
        return None
    if not isinstance(pty_obj, dict):
        raise _bad("pty is not an object")
    size = pty_obj.get("size") or {}
    if not isinstance(size, dict):
        raise _bad("pty.size is not an object")
    return (
        _uint(size.get("cols", 0), "pty.size.cols"),
        _uint(size.get("rows", 0), "pty.size.rows"),
    )


def parse_start_request(obj: Mapping[str, Any]) -> StartSpec:
    """Validate a ``StartRequest`` JSON object (unknown fields are ignored).

    Raises:
        RpcError: ``invalid_argument`` for fields of the wrong type.
    """
    process = obj.get("process")
    if process is None:
        process = {}
    if not isinstance(process, dict):
        raise _bad("process is not an object")
    cmd = process.get("cmd", "")
    if not isinstance(cmd, str):
        raise _bad("process.cmd is not a string")
    args = process.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise _bad("process.args is not a list of strings")
    envs = process.get("envs") or {}
    if not isinstance(envs, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in envs.items()
    ):
        raise _bad("process.envs is not a map of strings")
    cwd = process.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise _bad("process.cwd is not a string")
    tag = obj.get("tag")
    if tag is not None and not isinstance(tag, str):
        raise _bad("tag is not a string")
    stdin = obj.get("stdin")
    if stdin is not None and not isinstance(stdin, bool):
        raise _bad("stdin is not a boolean")
    pty = parse_pty_size(obj.get("pty"))
    return StartSpec(
        cmd=cmd,
        args=tuple(args),
        envs=dict(envs),
        cwd=cwd,
        tag=tag,
        stdin=True if stdin is None else stdin,
        pty=pty,
    )


#: service.go getProcess: ``fmt.Errorf("invalid input type %T", selector)`` of the (possibly
#: nil) ``*rpc.ProcessSelector`` when neither pid nor tag is set.
_NO_SELECTOR = "invalid input type *process.ProcessSelector"

Selector = Union[int, str]
"""A ``ProcessSelector``: a pid (int) or a tag (str)."""


def parse_selector(obj: Mapping[str, Any]) -> Selector:
    """The ``process`` selector of a request: ``{"pid": N}`` or ``{"tag": "t"}``.

    Raises:
        RpcError: ``unimplemented`` when neither is set, ``invalid_argument`` for bad types.
    """
    sel = obj.get("process")
    if not isinstance(sel, dict):
        raise RpcError("unimplemented", _NO_SELECTOR)
    if "pid" in sel:
        return _uint(sel["pid"], "process.pid")
    if "tag" in sel:
        tag = sel["tag"]
        if not isinstance(tag, str):
            raise _bad("process.tag is not a string")
        return tag
    raise RpcError("unimplemented", _NO_SELECTOR)


def parse_signal(value: Any) -> int:
    """``SIGNAL_SIGKILL``/``SIGNAL_SIGTERM`` (name or number) as a signal number.

    Raises:
        RpcError: ``unimplemented`` ``invalid signal: …`` for anything else.
    """
    if isinstance(value, str) and value in _SIGNALS_BY_NAME:
        return _SIGNALS_BY_NAME[value]
    if isinstance(value, int) and not isinstance(value, bool) and value in (9, 15):
        return value
    if isinstance(value, str) and value.strip() in ("9", "15"):
        return int(value.strip())
    # envd prints the decoded enum: unset, 0 and names protojson ignores (connect-go decodes
    # with DiscardUnknown) are SIGNAL_UNSPECIFIED, another number prints as itself
    shown = "SIGNAL_UNSPECIFIED"
    if isinstance(value, int) and not isinstance(value, bool) and value != 0:
        shown = str(value)
    raise RpcError("unimplemented", f"invalid signal: {shown}")


def decode_input(obj: Mapping[str, Any]) -> Tuple[bytes, bool]:
    """The ``input`` of ``SendInput``: ``(data, is_pty)``.

    Raises:
        RpcError: ``unimplemented`` when neither ``stdin`` nor ``pty`` is set.
    """
    inp = obj.get("input")
    if not isinstance(inp, dict):
        raise RpcError("unimplemented", "invalid input type <nil>")
    if "stdin" in inp:
        return decode_b64(inp["stdin"], "input.stdin"), False
    if "pty" in inp:
        return decode_b64(inp["pty"], "input.pty"), True
    raise RpcError("unimplemented", "invalid input type <nil>")
