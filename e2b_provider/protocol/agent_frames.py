"""The file agent's wire format, sans I/O: requests to it, answer frames from it.

This module owns how the library talks to :mod:`e2b_provider.sandbox_side.file_agent` (the
request server the provider runs in a sandbox as the ``sandbox`` user): a request is one
line of ASCII JSON (``{"id": N, "op": ..., "len": L, ...}``) followed by ``L`` payload
bytes, written to the agent's standard input; an answer is one or more frames on its
standard output, each a header line ``F <id> <m|e> <json length> <data length>``, that much
JSON and that much data (``e`` marks the last frame of an answer; id 0 is the agent's
"ready"). :class:`FrameDecoder` turns output bytes, fed in any pieces, into
:class:`Frame` values, and refuses what the agent could never send (so a sandbox that
writes garbage ends the session instead of growing a buffer). Pure: no I/O, no threads.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Optional

import attrs

from ..errors import ProtocolError

__all__ = [
    "AGENT_VERSION",
    "MAX_FRAME_DATA",
    "MAX_FRAME_JSON",
    "Frame",
    "FrameDecoder",
    "encode_request",
]

#: The agent program's protocol version (its ready frame says which it speaks).
AGENT_VERSION = 2
#: The largest JSON part of one frame the decoder accepts (a listing chunk is far less).
MAX_FRAME_JSON = 16 << 20
#: The largest data part of one frame (a read's data, at most its ``max_bytes`` + 1).
MAX_FRAME_DATA = (1 << 30) + 1
_MAX_HEADER = 128
_HEADER = re.compile(rb"F ([0-9]{1,18}) ([me]) ([0-9]{1,12}) ([0-9]{1,12})", re.ASCII)


@attrs.frozen
class Frame:
    """One answer frame: the request it answers, whether it is the last, its JSON and data."""

    id: int
    last: bool
    answer: Dict[str, Any]
    data: bytes = b""


def encode_request(rid: int, op: str, fields: Dict[str, Any], payload: bytes = b"") -> bytes:
    """The bytes of one request: its JSON line, then ``payload``."""
    head = dict(fields)
    head["id"] = rid
    head["op"] = op
    head["len"] = len(payload)
    line = json.dumps(head, ensure_ascii=True, separators=(",", ":")).encode("ascii")
    return line + b"\n" + payload


class FrameDecoder:
    """Frames out of the agent's standard output, fed in pieces as they arrive.

    Raises :class:`ProtocolError` (from :meth:`feed`) for anything that is not a frame:
    after that the decoder is unusable, and so is the session.
    """

    def __init__(self, max_data: int = MAX_FRAME_DATA) -> None:
        self._buf = bytearray()
        self._head: Optional[re.Match[bytes]] = None
        self._max_data = max_data

    @property
    def buffered(self) -> int:
        """Bytes received and not yet part of a whole frame."""
        return len(self._buf)

    def feed(self, data: bytes) -> List[Frame]:
        """Take in ``data``; the frames it completed, in order."""
        self._buf += data
        out: List[Frame] = []
        while True:
            if self._head is None:
                nl = self._buf.find(b"\n", 0, _MAX_HEADER + 1)
                if nl < 0:
                    if len(self._buf) > _MAX_HEADER:
                        raise ProtocolError("the file agent wrote something that is not a frame")
                    return out
                m = _HEADER.fullmatch(bytes(self._buf[:nl]))
                if m is None:
                    raise ProtocolError("the file agent wrote something that is not a frame")
                if int(m.group(3)) > MAX_FRAME_JSON or int(m.group(4)) > self._max_data:
                    raise ProtocolError("the file agent announced a frame larger than allowed")
                del self._buf[: nl + 1]
                self._head = m
            m = self._head
            jlen, dlen = int(m.group(3)), int(m.group(4))
            if len(self._buf) < jlen + dlen:
                return out
            try:
                answer = json.loads(bytes(self._buf[:jlen]).decode("ascii"))
            except (UnicodeDecodeError, ValueError):
                raise ProtocolError("the file agent wrote a frame that is not JSON") from None
            if not isinstance(answer, dict):
                raise ProtocolError("the file agent wrote a frame that is not a JSON object")
            data = bytes(self._buf[jlen : jlen + dlen])
            del self._buf[: jlen + dlen]
            self._head = None
            out.append(Frame(int(m.group(1)), m.group(2) == b"e", answer, data))
