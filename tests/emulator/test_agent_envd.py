"""The agent's envd surface beyond commands, checked against envd 0.6.13's behaviour.

One agent subprocess (as root, on this host) serves the module. Covered: ``POST /files``
with ``Content-Encoding: gzip`` and bad codings, multipart edge cases, metadata; ``GET
/files`` content types, ranges (single, suffix, several), conditional requests, codings;
uploads and downloads through a ``/proc/<pid>/fd/<n>`` magic link held by another process;
``EntryInfo`` of files, directories and symlinks (to files, to directories, dangling,
loops) with envd's error codes; ``WatchDir`` and the polling watchers (event kinds,
recursion, entries, keepalives, errors, cleanup, overflow); ``StreamInput``; and the pure
Go-compatibility helpers (content sniffing, media types, ranges, dates).
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import gzip
import json
import os
import pwd
import re
import signal
import subprocess
import time
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple
from urllib.parse import quote

import pytest

from e2b_provider.emulator.agent import gohttp
from e2b_provider.emulator.agent.watch import MAX_PENDING
from e2b_provider.protocol.connect import encode_envelope

from .agent_client import (
    ROOT_ON_LINUX,
    Agent,
    Stream,
    UnixConnection,
    agent_fixture,
    b64,
    basic,
    multipart,
    request,
    running_agent,
    unary,
    wait_until,
    workdir_fixture,
)

pytestmark = ROOT_ON_LINUX

NOBODY = pwd.getpwnam("nobody")
OCTET = {"Content-Type": "application/octet-stream"}


agent = agent_fixture()
workdir = workdir_fixture()


def upload(
    agent: Agent, query: str, body: Any, headers: Optional[Dict[str, str]] = None
) -> Tuple[int, Dict[str, str], Any]:
    status, hdrs, raw = request(agent.sock, "POST", "/files?" + query, body, headers or OCTET)
    return status, hdrs, json.loads(raw)


def download(
    agent: Agent, path: str, headers: Optional[Dict[str, str]] = None
) -> Tuple[int, Dict[str, str], bytes]:
    return request(agent.sock, "GET", f"/files?path={path}", headers=headers)


def read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def write(path: str, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)


def fs(agent: Agent, method: str, msg: Dict[str, Any]) -> Tuple[int, Any]:
    return unary(agent.sock, f"/filesystem.Filesystem/{method}", msg)


# ---- pure Go-compatibility helpers ------------------------------------------------------


def test_go_content_type_rules() -> None:
    sniff = gohttp.detect_content_type
    assert sniff(b"") == "text/plain; charset=utf-8"
    assert sniff(b"hello\n") == "text/plain; charset=utf-8"
    assert sniff(b"  <!DOCTYPE html><p>") == "text/html; charset=utf-8"
    assert sniff(b"<html") == "text/plain; charset=utf-8"  # no tag-terminating byte yet
    assert sniff(b"<?xml version='1.0'?>") == "text/xml; charset=utf-8"
    assert sniff(b"\x89PNG\r\n\x1a\n....") == "image/png"
    assert sniff(b"%PDF-1.4") == "application/pdf"
    assert sniff(gzip.compress(b"x")) == "application/x-gzip"
    assert sniff(b"\x00asm\x01\x00\x00\x00") == "application/wasm"
    assert sniff(b"\x00\x01\x02") == "application/octet-stream"
    assert sniff(b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isom") == "video/mp4"
    assert gohttp.type_by_extension(".json") == "application/json"
    assert gohttp.type_by_extension(".HTML") == "text/html; charset=utf-8"
    assert gohttp.type_by_extension(".no-such-ext") == ""
    assert gohttp.file_ext("/a.b/c") == "" and gohttp.file_ext("/a/c.tar.gz") == ".gz"
    fmt = gohttp.format_media_type
    assert fmt("inline", {"filename": "a.txt"}) == "inline; filename=a.txt"
    assert fmt("inline", {"filename": "a b.txt"}) == 'inline; filename="a b.txt"'
    assert fmt("inline", {"filename": 'q"x'}) == 'inline; filename="q\\"x"'
    assert fmt("inline", {"filename": "é.txt"}) == "inline; filename*=utf-8''%C3%A9.txt"


def test_go_media_type_parsing() -> None:
    parse = gohttp.parse_media_type
    assert parse('form-data; name="file"; filename="/tmp/a b/c.txt"') == (
        "form-data",
        {"name": "file", "filename": "/tmp/a b/c.txt"},
    )
    assert parse('form-data; filename="x\\"y;z"')[1]["filename"] == 'x"y;z'
    assert parse('form-data; filename="C:\\dir\\f.txt"')[1]["filename"] == "C:\\dir\\f.txt"
    assert parse("form-data; name=file; filename*=utf-8''%2Ftmp%2F%C3%A9")[1] == {
        "name": "file",
        "filename": "/tmp/é",
    }
    assert parse("Multipart/Form-Data; Boundary=abc;") == (
        "multipart/form-data",
        {"boundary": "abc"},
    )
    for bad, message in (
        ("", "mime: no media type"),
        ("a/", "mime: expected token after slash"),
        ("form-data; name", "mime: invalid media parameter"),
        ("form-data; a=1; a=2", "mime: duplicate parameter name"),
    ):
        with pytest.raises(gohttp.MediaTypeError, match=re.escape(message)):
            parse(bad)


def test_go_range_and_date_rules() -> None:
    pr = gohttp.parse_range
    assert pr("", 10) == []
    assert pr("bytes=2-4", 10) == [(2, 3)]
    assert pr("bytes=-3", 10) == [(7, 3)]
    assert pr("bytes=-30", 10) == [(0, 10)]
    assert pr("bytes=8-", 10) == [(8, 2)]
    assert pr("bytes=8-100", 10) == [(8, 2)]
    assert pr("bytes= 0-0 , 5-5,", 10) == [(0, 1), (5, 1)]
    assert pr("bytes=20-30,2-3", 10) == [(2, 2)]
    for bad in ("bits=0-1", "bytes=5-2", "bytes=x-1", "bytes=-", "bytes=1"):
        with pytest.raises(gohttp.RangeError) as info:
            pr(bad, 10)
        assert str(info.value) == "invalid range" and not info.value.no_overlap
    with pytest.raises(gohttp.RangeError) as info:
        pr("bytes=10-", 10)
    assert info.value.no_overlap and str(info.value) == "invalid range: failed to overlap"
    t = 784111777
    assert gohttp.http_date(t) == "Sun, 06 Nov 1994 08:49:37 GMT"
    for text in (
        "Sun, 06 Nov 1994 08:49:37 GMT",
        "Sunday, 06-Nov-94 08:49:37 GMT",
        "Sun Nov  6 08:49:37 1994",
    ):
        assert gohttp.parse_http_date(text) == t, text
    assert gohttp.parse_http_date("Sun, 06 Nov 1994 08:49:37 UTC") is None
    assert gohttp.parse_http_date("yesterday") is None


def test_go_encoding_negotiation() -> None:
    accept = gohttp.accept_encoding
    assert accept(None) == accept("") == "identity"
    assert accept("gzip, deflate, br") == "gzip"
    assert accept("br;q=1.0, gzip;q=0.8") == "gzip"
    assert accept("identity, gzip") == "identity"
    assert accept("gzip;q=0.5, identity;q=0.9") == "identity"
    assert accept("*") == "identity"
    assert accept("*, identity;q=0") == "gzip"
    assert accept("br") == "identity"
    with pytest.raises(gohttp.EncodingError, match=r"supported: \[gzip\]"):
        accept("br, identity;q=0")
    with pytest.raises(gohttp.EncodingError):
        accept("*;q=0")
    assert gohttp.content_encoding(None) == "identity"
    assert gohttp.content_encoding("GZIP") == "gzip"
    assert gohttp.content_encoding("identity") == "identity"
    with pytest.raises(gohttp.EncodingError) as info:
        gohttp.content_encoding("gzip, identity")
    assert str(info.value) == "unsupported Content-Encoding: gzip, identity, supported: [gzip]"


# ---- POST /files -------------------------------------------------------------------------


def test_gzip_uploads_octet_stream_and_multipart(agent: Agent, workdir: str) -> None:
    data = os.urandom(100_000) + b"tail"
    gz = {**OCTET, "Content-Encoding": "gzip"}
    status, hdrs, body = upload(agent, f"path={workdir}/a.bin", gzip.compress(data), gz)
    assert status == 200 and body == [{"path": f"{workdir}/a.bin", "name": "a.bin", "type": "file"}]
    assert hdrs["content-type"] == "text/plain; charset=utf-8"
    assert read(f"{workdir}/a.bin") == data
    # several gzip members in a row are one stream (Go's multistream reader)
    two = gzip.compress(b"first ") + gzip.compress(b"second")
    assert upload(agent, f"path={workdir}/b.txt", two, gz)[0] == 200
    assert read(f"{workdir}/b.txt") == b"first second"
    # chunked body, gzip, multipart with two files
    form, ctype = multipart(
        [("file", f"{workdir}/m/1.txt", b"one"), ("file", f"{workdir}/2", b"2")]
    )
    packed = gzip.compress(form)
    status, _, body = upload(
        agent,
        "username=nobody",
        (packed[i : i + 7] for i in range(0, len(packed), 7)),
        {"Content-Type": ctype, "Content-Encoding": "GZip"},
    )
    assert status == 200, body
    assert [e["path"] for e in body] == [f"{workdir}/m/1.txt", f"{workdir}/2"]
    assert read(f"{workdir}/m/1.txt") == b"one"
    assert os.stat(f"{workdir}/m").st_uid == NOBODY.pw_uid
    # explicit identity
    assert (
        upload(agent, f"path={workdir}/c.txt", b"id", {**OCTET, "Content-Encoding": "identity"})[0]
        == 200
    )


def test_bad_content_encodings(agent: Agent, workdir: str) -> None:
    target = f"{workdir}/x.txt"
    for coding in ("br", "deflate", "gzip, identity", "x-gzip"):
        status, hdrs, body = upload(
            agent, f"path={target}", b"x", {**OCTET, "Content-Encoding": coding}
        )
        assert (status, body) == (
            400,
            {
                "code": 400,
                "message": f"error decompressing request body: unsupported Content-Encoding: "
                f"{coding}, supported: [gzip]",
            },
        )
        assert hdrs["content-type"] == "application/json; charset=utf-8"
    gz = {**OCTET, "Content-Encoding": "gzip"}
    prefix = "error decompressing request body: failed to create gzip reader: "
    assert upload(agent, f"path={target}", b"plain text, not gzip", gz)[2] == {
        "code": 400,
        "message": prefix + "gzip: invalid header",
    }
    assert upload(agent, f"path={target}", b"", gz)[2]["message"] == prefix + "EOF"
    assert upload(agent, f"path={target}", b"\x1f\x8b\x08", gz)[2]["message"] == (
        prefix + "unexpected EOF"
    )
    assert not os.path.exists(target)
    # a valid header but a broken stream: envd fails while writing (500), as here
    good = gzip.compress(b"payload" * 100)
    bad_crc = good[:-8] + bytes([good[-8] ^ 0xFF]) + good[-7:]
    status, _, body = upload(agent, f"path={target}", bad_crc, gz)
    assert (status, body["message"]) == (500, "error writing file: gzip: invalid checksum")
    status, _, body = upload(agent, f"path={target}", good[:-4], gz)
    assert (status, body["message"]) == (500, "error writing file: unexpected EOF")
    status, _, body = upload(agent, f"path={target}", good + b"junk!junk!", gz)
    assert (status, body["message"]) == (500, "error writing file: gzip: invalid header")


def test_upload_paths_users_and_errors(agent: Agent, workdir: str) -> None:
    assert upload(agent, "", b"x") == (
        400,
        upload(agent, "", b"x")[1],
        {"code": 400, "message": "path query parameter is required for raw body upload"},
    )
    # an empty path is given: it resolves to the home directory
    assert upload(agent, "path=", b"x")[2] == {"code": 400, "message": "path is a directory: /root"}
    assert upload(agent, f"path={workdir}/u&username=", b"x")[2] == {
        "code": 401,
        "message": "error looking up user '': user: unknown user ",
    }
    status, _, body = upload(agent, f"path={workdir}/u", b"x", {"Content-Type": "text/plain"})
    assert (status, body["message"]) == (
        400,
        "unsupported content type: text/plain, expected multipart/form-data or "
        "application/octet-stream",
    )
    assert upload(agent, "path=~other/x", b"x")[2]["message"] == (
        "error resolving path: failed to expand path '~other/x' for user 'root': "
        "cannot expand user-specific home dir"
    )
    write(f"{workdir}/file", b"")
    status, _, body = upload(agent, f"path={workdir}/file/sub/x", b"x")
    assert (status, body["message"]) == (
        500,
        f"error ensuring directories: path is a file: {workdir}/file",
    )


def test_upload_metadata(agent: Agent, workdir: str) -> None:
    target = f"{workdir}/meta.txt"
    status, _, body = upload(
        agent, f"path={target}", b"m", {**OCTET, "X-Metadata-Owner": "team a", "x-metadata-N": "1"}
    )
    assert status == 200 and body[0]["metadata"] == {"owner": "team a", "n": "1"}
    assert os.getxattr(target, "user.e2b.owner") == b"team a"
    entry = fs(agent, "Stat", {"path": target})[1]["entry"]
    assert entry["metadata"] == {"owner": "team a", "n": "1"}
    # an overwrite without metadata clears it
    status, _, body = upload(agent, f"path={target}", b"m2")
    assert status == 200 and "metadata" not in body[0]
    assert [n for n in os.listxattr(target) if n.startswith("user.e2b.")] == []
    status, _, body = upload(agent, f"path={target}", b"m", {**OCTET, "X-Metadata-K": "tab\there"})
    assert (status, body["message"]) == (
        400,
        'invalid metadata: metadata value for key "k" contains non-printable-ASCII byte 0x09 '
        "at offset 3",
    )
    status, _, body = upload(agent, f"path={target}", b"m", {**OCTET, "X-Metadata-K": "v" * 5000})
    assert (status, body["message"]) == (
        400,
        "invalid metadata: total metadata size 5010 exceeds 4096 bytes",
    )


def test_multipart_edge_cases(agent: Agent, workdir: str) -> None:
    b = "XyZ"
    ctype = f"multipart/form-data; boundary={b}"

    def post(raw: bytes, content_type: str = ctype) -> Tuple[int, Any]:
        status, _, body = upload(agent, "", raw, {"Content-Type": content_type})
        return status, body

    # a preamble, LF-only line ends, RFC 2231 filename, an epilogue
    raw = (
        f"preamble line\n--{b}\ncontent-disposition: form-data; name=file; "
        f"filename*=utf-8''{workdir.replace('/', '%2F')}%2F%C3%A9.txt\n\nhello\n--{b}--\nbye"
    ).encode()
    status, body = post(raw)
    assert status == 200 and body == [{"path": f"{workdir}/é.txt", "name": "é.txt", "type": "file"}]
    assert read(f"{workdir}/é.txt") == b"hello"
    # a body that contains the boundary text without being a boundary
    tricky = f"a\r\n--{b}x\r\n--{b}-y\r\n-".encode()
    raw = (
        (
            f'--{b}\r\nContent-Disposition: form-data; name="file"; filename="{workdir}/t"\r\n\r\n'
        ).encode()
        + tricky
        + f"\r\n--{b}--\r\n".encode()
    )
    assert post(raw)[0] == 200 and read(f"{workdir}/t") == tricky
    assert post(f"--{b}--\r\n".encode()) == (200, [])
    assert post(b"") == (
        500,
        {"code": 500, "message": "error reading form: multipart: NextPart: EOF"},
    )
    raw = f'--{b}\r\nContent-Disposition: form-data; name="file"\r\n\r\nx\r\n--{b}--\r\n'.encode()
    assert post(raw) == (
        400,
        {
            "code": 400,
            "message": "error getting multipart custom part file name: filename not found in "
            "Content-Disposition header",
        },
    )
    raw = (
        f'--{b}\r\nContent-Disposition: form-data; name="file"; filename="{workdir}/cut"\r\n\r\n'
        "no closing boundary"
    ).encode()
    assert post(raw) == (500, {"code": 500, "message": "error writing file: unexpected EOF"})
    assert post(b"x", "multipart/related; boundary=a")[1]["message"] == (
        "error parsing multipart form: request Content-Type isn't multipart/form-data"
    )
    assert post(b"x", "multipart/form-data")[1]["message"] == (
        "error parsing multipart form: no multipart boundary param in Content-Type"
    )
    form, mctype = multipart(
        [
            ("file", f"{workdir}/d1", b"1"),
            ("file", f"{workdir}/d2", b"2"),
            ("file", f"{workdir}/d1", b"3"),
        ]
    )
    status, body = post(form, mctype)
    assert (status, body["message"]) == (
        400,
        f"you cannot upload multiple files to the same path '{workdir}/d1' in one upload "
        "request, only the first specified file was uploaded",
    )


def test_upload_into_a_fifo_waits_for_its_reader(agent: Agent, workdir: str) -> None:
    fifo = f"{workdir}/pipe"
    os.mkfifo(fifo)
    data = os.urandom(300_000)  # more than a pipe holds: the writer waits for the reader too
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(upload, agent, f"path={fifo}", data)
        assert request(agent.sock, "GET", "/health")[0] == 204  # the agent is not blocked
        assert not pending.done()
        with open(fifo, "rb") as reader:
            got = reader.read()
        status, _, body = pending.result(timeout=20)
    assert (status, got) == (200, data) and body[0]["path"] == fifo


# ---- GET /files --------------------------------------------------------------------------


def test_download_types_and_disposition(agent: Agent, workdir: str) -> None:
    cases = {
        "data.json": (b"{}", "application/json"),
        "page.html": (b"hi", "text/html; charset=utf-8"),
        "noext": (b"\x89PNG\r\n\x1a\nrest", "image/png"),
        "script": (b"<html><body>", "text/html; charset=utf-8"),
        "binary": (b"\x00\x01\x02", "application/octet-stream"),
        "a b é.txt": (b"text", "text/plain; charset=utf-8"),
    }
    for name, (data, ctype) in cases.items():
        write(f"{workdir}/{name}", data)
        status, hdrs, body = download(agent, quote(f"{workdir}/{name}"))
        assert (status, body, hdrs["content-type"]) == (200, data, ctype), name
        assert hdrs["accept-ranges"] == "bytes" and hdrs["vary"] == "Accept-Encoding"
        assert hdrs["content-length"] == str(len(data))
        assert hdrs["last-modified"] == gohttp.http_date(os.stat(f"{workdir}/{name}").st_mtime)
    status, hdrs, _ = download(agent, quote(f"{workdir}/a b é.txt"))
    assert hdrs["content-disposition"] == "inline; filename*=utf-8''a%20b%20%C3%A9.txt"
    # gzip: the type comes from the extension only
    status, hdrs, body = download(agent, f"{workdir}/noext", {"Accept-Encoding": "gzip"})
    assert (status, hdrs["content-encoding"], hdrs["content-type"]) == (
        200,
        "gzip",
        "application/octet-stream",
    )
    assert "content-length" not in hdrs and gzip.decompress(body) == cases["noext"][0]
    # a device and an empty file
    status, hdrs, body = download(agent, "/dev/null")
    assert (status, body, hdrs["content-length"]) == (200, b"", "0")
    status, _, _ = request(agent.sock, "HEAD", f"/files?path={workdir}/noext")
    assert status == 405


def test_download_ranges(agent: Agent, workdir: str) -> None:
    path = f"{workdir}/r.txt"
    write(path, b"0123456789")

    def get(rng: str, **extra: str) -> Tuple[int, Dict[str, str], bytes]:
        return download(agent, path, {"Range": rng, **extra})

    assert get("bytes=2-4")[0::2] == (206, b"234")
    assert get("bytes=2-4")[1]["content-range"] == "bytes 2-4/10"
    assert get("bytes=-3")[0::2] == (206, b"789")
    assert get("bytes=7-")[0::2] == (206, b"789")
    status, hdrs, body = get("bytes=10-")
    assert (status, hdrs["content-range"], body) == (
        416,
        "bytes */10",
        b"invalid range: failed to overlap\n",
    )
    assert hdrs["content-type"] == "text/plain; charset=utf-8" and "last-modified" not in hdrs
    status, hdrs, body = get("bytes=5-2")
    assert (status, body, "content-range" in hdrs) == (416, b"invalid range\n", False)
    # more bytes asked for than the file has: served whole
    assert get("bytes=0-9,0-9")[0::2] == (200, b"0123456789")
    # gzip is accepted but a range forces identity
    status, hdrs, body = get("bytes=0-1", **{"Accept-Encoding": "gzip"})
    assert (status, body, "content-encoding" in hdrs) == (206, b"01", False)
    status, hdrs, body = get("bytes=0-1", **{"Accept-Encoding": "gzip, identity;q=0"})
    assert status == 406 and hdrs["vary"] == "Accept-Encoding"
    assert json.loads(body)["message"] == (
        "identity encoding not acceptable for Range or conditional request"
    )
    # several ranges: multipart/byteranges with an exact length
    status, hdrs, body = get("bytes=0-1,5-5")
    assert status == 206 and hdrs["content-length"] == str(len(body))
    m = re.fullmatch(r"multipart/byteranges; boundary=([0-9a-f]{60})", hdrs["content-type"])
    assert m is not None
    boundary = m.group(1)
    part = "--{}\r\nContent-Range: bytes {}/10\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n"
    assert (
        body
        == (
            part.format(boundary, "0-1")
            + "01\r\n"
            + part.format(boundary, "5-5")
            + f"5\r\n--{boundary}--\r\n"
        ).encode()
    )
    # an empty file ignores an unsatisfiable range
    write(f"{workdir}/empty", b"")
    assert download(agent, f"{workdir}/empty", {"Range": "bytes=0-"})[0::2] == (200, b"")


def test_download_conditionals(agent: Agent, workdir: str) -> None:
    path = f"{workdir}/c.txt"
    write(path, b"abc")
    os.utime(path, (1_000_000_000, 1_000_000_000))
    modified = gohttp.http_date(1_000_000_000)
    before = gohttp.http_date(999_999_999)
    status, hdrs, body = download(agent, path, {"If-Modified-Since": modified})
    assert (status, body, hdrs["last-modified"]) == (304, b"", modified)
    assert "content-type" not in hdrs and hdrs["vary"] == "Accept-Encoding"
    assert download(agent, path, {"If-Modified-Since": before})[0] == 200
    assert download(agent, path, {"If-Unmodified-Since": before})[0] == 412
    assert download(agent, path, {"If-Unmodified-Since": modified})[0] == 200
    assert download(agent, path, {"If-None-Match": "*"})[0] == 304
    assert download(agent, path, {"If-None-Match": '"x"', "If-Modified-Since": modified})[0] == 200
    assert download(agent, path, {"If-Match": '"x"'})[0] == 412
    assert download(agent, path, {"If-Match": "*"})[0] == 200
    assert download(agent, path, {"Range": "bytes=0-0", "If-Range": modified})[0::2] == (206, b"a")
    assert download(agent, path, {"Range": "bytes=0-0", "If-Range": before})[0::2] == (200, b"abc")
    assert download(agent, path, {"Range": "bytes=0-0", "If-Range": '"etag"'})[0] == 200
    # a conditional request forces identity even when gzip is accepted
    status, hdrs, _ = download(
        agent, path, {"If-Modified-Since": before, "Accept-Encoding": "gzip"}
    )
    assert status == 200 and "content-encoding" not in hdrs
    status, _, body = download(agent, path, {"Accept-Encoding": "identity;q=0"})
    assert (status, json.loads(body)["message"]) == (
        406,
        "error parsing Accept-Encoding: no acceptable encoding found, supported: [gzip]",
    )


def test_download_errors(agent: Agent, workdir: str) -> None:
    status, hdrs, body = download(agent, f"{workdir}/missing")
    assert (status, json.loads(body)) == (
        404,
        {"code": 404, "message": f"path '{workdir}/missing' does not exist"},
    )
    assert hdrs["x-content-type-options"] == "nosniff" and body.endswith(b"}\n")
    assert download(agent, workdir)[0] == 400
    status, _, body = request(agent.sock, "GET", "/files")
    assert (status, json.loads(body)["message"]) == (400, "path '/root' is a directory")
    status, _, body = request(agent.sock, "GET", f"/files?path={workdir}/x&username=nosuchuser")
    assert (status, json.loads(body)["message"]) == (
        401,
        "error looking up user 'nosuchuser': user: unknown user nosuchuser",
    )
    write(f"{workdir}/file", b"")
    status, _, body = download(agent, f"{workdir}/file/sub")
    assert (status, json.loads(body)["message"]) == (
        500,
        f"error checking if path exists '{workdir}/file/sub': stat {workdir}/file/sub: "
        "not a directory",
    )


@pytest.fixture
def holder(workdir: str) -> Iterator[Tuple[str, int, str]]:
    """Another process holding ``held.txt`` open read-write: ``(path, pid, link)``."""
    path = f"{workdir}/held.txt"
    write(path, b"original content")
    proc = subprocess.Popen(
        ["/bin/sh", "-c", 'exec 7<>"$1"; echo ready; exec sleep 60', "sh", path],
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n"
        yield path, proc.pid, f"/proc/{proc.pid}/fd/7"
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_files_through_a_proc_fd_magic_link(agent: Agent, holder: Tuple[str, int, str]) -> None:
    path, _, link = holder
    inode = os.stat(path).st_ino
    status, hdrs, body = download(agent, link, {"Range": "bytes=9-15"})
    assert (status, body, hdrs["content-range"]) == (206, b"content", "bytes 9-15/16")
    assert hdrs["content-type"] == "text/plain; charset=utf-8"  # no extension: sniffed
    os.chown(path, 0, 0)
    status, _, result = upload(agent, f"path={link}&username=nobody", b"new")
    assert status == 200 and result == [
        {"path": link, "name": link.rsplit("/", 1)[1], "type": "file"}
    ]
    st = os.stat(path)
    # the same file was truncated and rewritten through the link, and chowned to the user
    assert (st.st_ino, st.st_size, st.st_uid) == (inode, 3, NOBODY.pw_uid)
    assert read(path) == b"new"
    assert os.path.islink(link)
    # an unlinked file stays reachable through the holder's descriptor
    os.unlink(path)
    assert download(agent, link)[0::2] == (200, b"new")
    assert (
        upload(agent, f"path={link}", gzip.compress(b"gz"), {**OCTET, "Content-Encoding": "gzip"})[
            0
        ]
        == 200
    )
    assert download(agent, link, {"Range": "bytes=-1"})[0::2] == (206, b"z")


# ---- filesystem entries -----------------------------------------------------------------


def test_entry_info_of_symlinks(agent: Agent, workdir: str) -> None:
    write(f"{workdir}/f.txt", b"hello")
    os.chmod(f"{workdir}/f.txt", 0o640)
    os.mkdir(f"{workdir}/d", 0o750)
    os.symlink("f.txt", f"{workdir}/to-file")
    os.symlink(f"{workdir}/d", f"{workdir}/to-dir")
    os.symlink("nowhere", f"{workdir}/dangling")
    os.symlink("loop", f"{workdir}/loop")
    os.symlink("to-file", f"{workdir}/chain")
    ls = os.lstat(f"{workdir}/to-file")

    entry = fs(agent, "Stat", {"path": f"{workdir}/to-file"})[1]["entry"]
    assert entry.pop("modifiedTime").endswith("Z")
    assert entry == {
        "name": "to-file",
        "type": "FILE_TYPE_FILE",
        "path": f"{workdir}/to-file",
        "size": str(ls.st_size),  # the link's own size (lstat)
        "mode": 0o640,  # the target's permission bits
        "permissions": "Lrwxrwxrwx",
        "owner": "root",
        "group": "root",
        "symlinkTarget": f"{workdir}/f.txt",
    }
    entry = fs(agent, "Stat", {"path": f"{workdir}/chain"})[1]["entry"]
    assert (entry["type"], entry["symlinkTarget"]) == ("FILE_TYPE_FILE", f"{workdir}/f.txt")
    entry = fs(agent, "Stat", {"path": f"{workdir}/to-dir"})[1]["entry"]
    assert (entry["type"], entry["mode"], entry["symlinkTarget"]) == (
        "FILE_TYPE_DIRECTORY",
        0o750,
        f"{workdir}/d",
    )
    for name in ("dangling", "loop"):
        entry = fs(agent, "Stat", {"path": f"{workdir}/{name}"})[1]["entry"]
        assert "type" not in entry and "mode" not in entry, name
        assert entry["symlinkTarget"] == f"{workdir}/{name}" and "isSymlink" not in entry
    entry = fs(agent, "Stat", {"path": f"{workdir}/f.txt"})[1]["entry"]
    assert "symlinkTarget" not in entry and "isSymlink" not in entry
    assert (entry["mode"], entry["permissions"], entry["size"]) == (0o640, "-rw-r-----", "5")
    fifo = f"{workdir}/fifo"
    os.mkfifo(fifo)
    entry = fs(agent, "Stat", {"path": fifo})[1]["entry"]
    assert "type" not in entry and entry["permissions"].startswith("p")
    os.unlink(fifo)

    # listing through a symlinked directory reports paths under the requested path
    write(f"{workdir}/d/inner.txt", b"")
    status, body = fs(agent, "ListDir", {"path": f"{workdir}/to-dir"})
    assert status == 200 and [e["path"] for e in body["entries"]] == [f"{workdir}/to-dir/inner.txt"]
    names = [
        (e["name"], e.get("type")) for e in fs(agent, "ListDir", {"path": workdir})[1]["entries"]
    ]
    assert names == [
        ("chain", "FILE_TYPE_FILE"),
        ("d", "FILE_TYPE_DIRECTORY"),
        ("dangling", None),
        ("f.txt", "FILE_TYPE_FILE"),
        ("loop", None),
        ("to-dir", "FILE_TYPE_DIRECTORY"),
        ("to-file", "FILE_TYPE_FILE"),
    ]


def test_filesystem_error_codes(agent: Agent, workdir: str) -> None:
    write(f"{workdir}/file", b"")
    os.symlink("loop", f"{workdir}/loop")
    assert fs(agent, "ListDir", {"path": f"{workdir}/loop"}) == (
        400,
        {
            "code": "failed_precondition",
            "message": f'cyclic symlink or chain >255 links at "{workdir}/loop"',
        },
    )
    assert fs(agent, "ListDir", {"path": f"{workdir}/nope/x"}) == (
        404,
        {
            "code": "not_found",
            "message": f"path not found: lstat {workdir}/nope: no such file or directory",
        },
    )
    assert fs(agent, "ListDir", {"path": f"{workdir}/file"}) == (
        400,
        {"code": "invalid_argument", "message": f"path is not a directory: {workdir}/file"},
    )
    assert fs(agent, "ListDir", {"path": f"{workdir}/file/x"}) == (
        500,
        {"code": "internal", "message": "error resolving symlink: not a directory"},
    )
    assert fs(agent, "Stat", {"path": f"{workdir}/file/x"}) == (
        500,
        {
            "code": "internal",
            "message": f"error getting file info: lstat {workdir}/file/x: not a directory",
        },
    )
    assert fs(agent, "Stat", {"path": f"{workdir}/loop/x"})[1]["message"] == (
        f"error getting file info: lstat {workdir}/loop/x: too many levels of symbolic links"
    )
    assert fs(agent, "Remove", {"path": f"{workdir}/file/x"}) == (
        500,
        {
            "code": "internal",
            "message": f"error removing file or directory: unlinkat {workdir}/file/x: "
            "not a directory",
        },
    )
    assert fs(agent, "Remove", {"path": f"{workdir}/."})[1]["message"] == (
        f"error removing file or directory: RemoveAll {workdir}/.: invalid argument"
    )
    assert fs(agent, "Remove", {"path": f"{workdir}/nope"}) == (200, {})
    assert fs(agent, "MakeDir", {"path": f"{workdir}/file/x"})[1] == {
        "code": "internal",
        "message": f"error getting file info: stat {workdir}/file/x: not a directory",
    }
    assert fs(agent, "Stat", {"path": "~nobody/x"})[1] == {
        "code": "invalid_argument",
        "message": "failed to expand path '~nobody/x' for user 'root': "
        "cannot expand user-specific home dir",
    }
    # an empty path is the default workdir (here root's home)
    assert fs(agent, "Stat", {"path": ""})[1]["entry"]["path"] == "/root"


# ---- watchers ---------------------------------------------------------------------------

WATCH = "/filesystem.Filesystem/WatchDir"


def watched_inodes(pid: int) -> Set[int]:
    """Inodes of the kernel inotify watches process ``pid`` holds (from its fdinfo)."""
    found: Set[int] = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:inotify":
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as fh:
                for line in fh:
                    m = re.match(r"inotify wd:\S+ ino:([0-9a-f]+) ", line)
                    if m:
                        found.add(int(m.group(1), 16))
        except OSError:
            continue
    return found


def watching(agent: Agent, *paths: str) -> bool:
    """Whether the agent holds a kernel watch on any of ``paths``."""
    return bool(watched_inodes(agent.pid) & {os.stat(p).st_ino for p in paths})


def tree(root: str) -> List[str]:
    return [root] + [os.path.join(d, n) for d, dirs, _ in os.walk(root) for n in dirs]


class Watch:
    """An open ``WatchDir`` stream (keepalive every second)."""

    def __init__(self, agent: Agent, path: str, **options: Any) -> None:
        headers = {"Keepalive-Ping-Interval": "1", **options.pop("headers", {})}
        self.stream = Stream(agent.sock, WATCH, {"path": path, **options}, headers)
        self.keepalives = 0

    def first(self) -> Optional[Dict[str, Any]]:
        return self.stream.next_message()

    def events(self, until: Any, timeout: float = 10.0) -> List[Dict[str, Any]]:
        """Filesystem events until ``until(events)`` holds."""
        got: List[Dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while not until(got):
            assert time.monotonic() < deadline, f"no matching events in {got}"
            message = self.stream.next_message()
            assert message is not None, self.stream.end
            if "keepalive" in message:
                self.keepalives += 1
            else:
                got.append(message["filesystem"])
        return got

    def rest(self, timeout: float = 30.0) -> List[Dict[str, Any]]:
        """Every filesystem event until the end-of-stream frame (see ``stream.end``)."""
        got: List[Dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while True:
            assert time.monotonic() < deadline, f"the stream did not end; got {got[-5:]}"
            message = self.stream.next_message()
            if message is None:
                return got
            if "filesystem" in message:
                got.append(message["filesystem"])

    def close(self) -> None:
        self.stream.close()


def kinds(events: List[Dict[str, Any]]) -> List[Tuple[str, str]]:
    return [(e["name"], e["type"].replace("EVENT_TYPE_", "")) for e in events]


def has(*wanted: Tuple[str, str]) -> Any:
    return lambda events: all(w in kinds(events) for w in wanted)


def test_watch_dir_events(agent: Agent, workdir: str) -> None:
    w = Watch(agent, workdir)
    try:
        assert w.first() == {"start": {}}
        write(f"{workdir}/a.txt", b"x")
        events = w.events(has(("a.txt", "CREATE"), ("a.txt", "WRITE")))
        assert kinds(events)[:2] == [("a.txt", "CREATE"), ("a.txt", "WRITE")]
        os.chmod(f"{workdir}/a.txt", 0o600)
        w.events(has(("a.txt", "CHMOD")))
        os.rename(f"{workdir}/a.txt", f"{workdir}/b.txt")
        w.events(has(("a.txt", "RENAME"), ("b.txt", "CREATE")))
        os.unlink(f"{workdir}/b.txt")
        w.events(has(("b.txt", "REMOVE")))
        # not recursive: a subdirectory's own contents are not reported
        os.mkdir(f"{workdir}/sub")
        write(f"{workdir}/sub/inner", b"")
        write(f"{workdir}/c", b"")
        events = w.events(has(("c", "CREATE")))
        assert ("sub", "CREATE") in kinds(events)
        assert all(not e["name"].startswith("sub/") for e in events)
        assert all("entry" not in e for e in events)
        w.events(lambda _: w.keepalives >= 1)
    finally:
        w.close()
    wait_until(lambda: not watching(agent, *tree(workdir)), what="the watch to be removed")


def test_watch_dir_recursive_with_entries(agent: Agent, workdir: str) -> None:
    os.makedirs(f"{workdir}/old/deep")
    w = Watch(agent, workdir, recursive=True, includeEntry=True)
    try:
        assert w.first() == {"start": {}}
        assert watched_inodes(agent.pid) >= {os.stat(p).st_ino for p in tree(workdir)}
        write(f"{workdir}/old/deep/f", b"1")
        events = w.events(has(("old/deep/f", "WRITE")))
        create = next(e for e in events if e["type"] == "EVENT_TYPE_CREATE")
        assert create["entry"]["path"] == f"{workdir}/old/deep/f"
        # a directory moved in with content already inside: its content is reported as created
        staging = os.path.dirname(workdir) + "/staging"
        os.makedirs(f"{staging}/n1/n2")
        write(f"{staging}/n1/n2/leaf", b"")
        os.rename(f"{staging}/n1", f"{workdir}/n1")
        events = w.events(has(("n1", "CREATE"), ("n1/n2/leaf", "CREATE")))
        assert kinds(events)[-3:] == [
            ("n1", "CREATE"),
            ("n1/n2", "CREATE"),
            ("n1/n2/leaf", "CREATE"),
        ]
        write(f"{workdir}/n1/n2/later", b"")
        w.events(has(("n1/n2/later", "CREATE")))
        # a directory moved within the tree keeps being watched under its new name
        os.rename(f"{workdir}/n1", f"{workdir}/old/moved")
        w.events(has(("n1", "RENAME"), ("old/moved", "CREATE")))
        write(f"{workdir}/old/moved/n2/x", b"")
        w.events(has(("old/moved/n2/x", "CREATE")))
        os.unlink(f"{workdir}/old/moved/n2/x")
        events = w.events(has(("old/moved/n2/x", "REMOVE")))
        assert all("entry" not in e for e in events if e["type"] == "EVENT_TYPE_REMOVE")
    finally:
        w.close()
    wait_until(lambda: not watching(agent, *tree(workdir)), what="the watches to be removed")


def test_watch_dir_of_the_watched_directory_itself(agent: Agent, workdir: str) -> None:
    target = f"{workdir}/t"
    os.mkdir(target)
    w = Watch(agent, target)
    try:
        assert w.first() == {"start": {}}
        os.rmdir(target)
        w.events(has((".", "REMOVE")))
    finally:
        w.close()
    os.makedirs(f"{target}/sub")
    w = Watch(agent, target, recursive=True)
    try:
        assert w.first() == {"start": {}}
        os.rename(target, f"{workdir}/renamed")
        w.events(has((".", "RENAME")))
        # the moved tree is no longer watched: the stream only keeps its keepalives
        wait_until(lambda: not watching(agent, *tree(f"{workdir}/renamed")), what="unwatch")
        write(f"{workdir}/renamed/sub/late", b"")
        before = w.keepalives
        assert w.events(lambda _: w.keepalives >= before + 1) == []
    finally:
        w.close()


def test_watch_dir_errors_and_deadline(agent: Agent, workdir: str) -> None:
    write(f"{workdir}/file", b"")
    for path, code, message in (
        (
            f"{workdir}/missing",
            "not_found",
            f"path {workdir}/missing not found: stat {workdir}/missing: no such file or directory",
        ),
        (
            f"{workdir}/file",
            "invalid_argument",
            f"path {workdir}/file not a directory: %!w(<nil>)",
        ),
    ):
        w = Watch(agent, path)
        try:
            assert w.first() is None and w.stream.resp.status == 200
            assert w.stream.end is not None
            assert (w.stream.end.error_code, w.stream.end.error_message) == (code, message)
        finally:
            w.close()
        assert fs(agent, "CreateWatcher", {"path": path}) == (
            400 if code == "invalid_argument" else 404,
            {"code": code, "message": message},
        )
    w = Watch(agent, workdir, headers={"Connect-Timeout-Ms": "300"})
    try:
        assert w.first() == {"start": {}}
        assert w.first() is None
        assert w.stream.end is not None
        assert w.stream.end.error_code == "deadline_exceeded"
    finally:
        w.close()
    wait_until(lambda: not watching(agent, *tree(workdir)), what="the watch to be removed")


def test_polling_watcher(agent: Agent, workdir: str) -> None:
    status, body = fs(agent, "CreateWatcher", {"path": workdir, "recursive": True})
    assert status == 200 and re.fullmatch(r"w[a-z0-9]{20}", body["watcherId"])
    wid = body["watcherId"]
    try:
        assert fs(agent, "GetWatcherEvents", {"watcherId": wid}) == (200, {})
        os.mkdir(f"{workdir}/s")
        wait_until(lambda: watching(agent, f"{workdir}/s"), what="the new directory's watch")
        write(f"{workdir}/s/f", b"data")
        got: List[Dict[str, Any]] = []

        def seen() -> bool:
            got.extend(fs(agent, "GetWatcherEvents", {"watcherId": wid})[1].get("events", []))
            return ("s/f", "WRITE") in kinds(got)

        wait_until(seen, what="polled events")
        assert kinds(got) == [("s", "CREATE"), ("s/f", "CREATE"), ("s/f", "WRITE")]
    finally:
        assert fs(agent, "RemoveWatcher", {"watcherId": wid}) == (200, {})
    assert fs(agent, "GetWatcherEvents", {"watcherId": wid}) == (
        404,
        {"code": "not_found", "message": f"watcher with id {wid} not found"},
    )
    assert fs(agent, "RemoveWatcher", {"watcherId": wid})[0] == 404
    wait_until(lambda: not watching(agent, *tree(workdir)), what="the watches to be removed")


def churn(workdir: str, events: int, *, paced_by: Optional[Agent] = None) -> None:
    """Cause ``events`` inotify events in ``workdir``: one-byte writes to two files in turn
    (the kernel merges an event only into an identical one queued just before it).

    ``paced_by``: after each 1,000 writes, wait for that agent to answer a request. Its
    event loop reads every inotify instance that has events queued (each is readable) in
    the turn that takes the request, before the answer can go: so however slowly the agent
    is scheduled, its kernel queues never hold more than the last 1,000 events."""
    fds = [os.open(f"{workdir}/{n}", os.O_CREAT | os.O_WRONLY, 0o644) for n in "ab"]
    try:
        for i in range(events):
            os.write(fds[i % 2], b"x")
            if paced_by is not None and i % 1000 == 999:
                assert request(paced_by.sock, "GET", "/health")[0] == 204
    finally:
        for fd in fds:
            os.close(fd)


def inotify_instances(pid: int) -> int:
    """How many inotify instances process ``pid`` holds."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:inotify"
        except OSError:
            continue
    return count


@contextlib.contextmanager
def stopped(agent: Agent) -> Iterator[None]:
    """The agent stopped (SIGSTOP) for the block: what happens meanwhile waits in the
    kernel's inotify queues until it goes on."""
    os.kill(agent.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(agent.pid, signal.SIGCONT)


def max_queued_events() -> int:
    with open("/proc/sys/fs/inotify/max_queued_events") as fh:
        return int(fh.read())


def test_polling_watcher_memory_is_bounded(agent: Agent, workdir: str) -> None:
    wid = fs(agent, "CreateWatcher", {"path": workdir})[1]["watcherId"]
    try:
        churn(workdir, MAX_PENDING + 100)

        def failed() -> bool:
            return fs(agent, "GetWatcherEvents", {"watcherId": wid})[0] == 500

        wait_until(failed, timeout=30, what="the overflow error")
        assert fs(agent, "GetWatcherEvents", {"watcherId": wid})[1] == {
            "code": "internal",
            "message": "watcher error: fsnotify: queue or buffer overflow",
        }
        assert not watching(agent, workdir)
    finally:
        assert fs(agent, "RemoveWatcher", {"watcherId": wid})[0] == 200


def test_polling_watcher_keeps_what_the_kernel_queue_could_not(agent: Agent, workdir: str) -> None:
    # envd reads the kernel's queue as it fills and keeps the events in memory: a client
    # that polls late still gets them all (more than the kernel's queue holds)
    wid = fs(agent, "CreateWatcher", {"path": workdir})[1]["watcherId"]
    want = max_queued_events() + 4000
    got: List[Dict[str, Any]] = []

    def poll() -> None:
        status, answer = fs(agent, "GetWatcherEvents", {"watcherId": wid})
        assert status == 200, answer  # an overflow would say so here
        got.extend(answer.get("events", []))

    try:
        churn(workdir, want, paced_by=agent)  # a: create, b: create, then the writes
        poll()

        def all_in() -> bool:
            poll()
            return len(got) >= want + 2

        wait_until(all_in, timeout=30, what="every event")
        assert kinds(got)[:4] == [("a", "CREATE"), ("b", "CREATE"), ("a", "WRITE"), ("b", "WRITE")]
        assert len(got) == want + 2
    finally:
        assert fs(agent, "RemoveWatcher", {"watcherId": wid})[0] == 200


def test_each_watcher_has_its_own_inotify_instance(agent: Agent, tmp_path: Any) -> None:
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    os.mkdir(one)
    os.mkdir(two)
    before = inotify_instances(agent.pid)
    flooded, calm = Watch(agent, one), Watch(agent, two)
    wid = fs(agent, "CreateWatcher", {"path": two})[1]["watcherId"]
    try:
        assert flooded.first() == calm.first() == {"start": {}}
        assert inotify_instances(agent.pid) == before + 3
        # while the agent is stopped the kernel queues: one's overflows, two's does not
        with stopped(agent):
            churn(one, max_queued_events() + 100)
            write(f"{two}/later", b"")
        got = flooded.rest()
        assert flooded.stream.end is not None
        assert (flooded.stream.end.error_code, flooded.stream.end.error_message) == (
            "internal", "watcher error: fsnotify: queue or buffer overflow")
        assert len(got) >= max_queued_events() - 10  # what was queued before the overflow
        calm.events(has(("later", "CREATE")))
        polled: List[Dict[str, Any]] = []

        def seen() -> bool:
            polled.extend(fs(agent, "GetWatcherEvents", {"watcherId": wid})[1].get("events", []))
            return ("later", "CREATE") in kinds(polled)

        wait_until(seen, what="the polling watcher's event")
        wait_until(lambda: inotify_instances(agent.pid) == before + 2, what="the flooded one's end")
    finally:
        flooded.close()
        calm.close()
        assert fs(agent, "RemoveWatcher", {"watcherId": wid})[0] == 200
    wait_until(lambda: inotify_instances(agent.pid) == before, what="every instance closed")


def test_watch_dir_has_no_queue_of_its_own(agent: Agent, workdir: str) -> None:
    # A client that reads nothing: the agent stops reading the kernel's queue once the
    # connection's buffers are full, so the events wait in the kernel (its queue, not the
    # agent's memory) until the queue overflows; the client then gets everything queued
    # before the overflow, and the error.
    w = Watch(agent, workdir)
    try:
        assert w.first() == {"start": {}}
        churn(workdir, 3 * max_queued_events())
        got = w.rest()
        assert w.stream.end is not None
        assert w.stream.end.error_message == "watcher error: fsnotify: queue or buffer overflow"
        assert max_queued_events() <= len(got) < 3 * max_queued_events()
    finally:
        w.close()


def test_recursive_watch_ends_when_a_new_directory_vanishes(agent: Agent, workdir: str) -> None:
    # fsnotify cannot watch a directory that is gone by the time it handles its creation:
    # it sends that error, which ends the watch (envd: "watcher error: ...")
    w = Watch(agent, workdir, recursive=True)
    try:
        assert w.first() == {"start": {}}
        write(f"{workdir}/before", b"")
        w.events(has(("before", "CREATE")))
        with stopped(agent):
            os.mkdir(f"{workdir}/brief")
            os.rmdir(f"{workdir}/brief")
            write(f"{workdir}/after", b"")
        assert w.rest() == []  # neither the directory nor what came after it
        assert w.stream.end is not None
        assert (w.stream.end.error_code, w.stream.end.error_message) == (
            "internal", "watcher error: no such file or directory")
    finally:
        w.close()


# ---- StreamInput ---------------------------------------------------------------------------


def stream_input(agent: Agent, messages: List[Dict[str, Any]]) -> Tuple[int, List[Any]]:
    conn = UnixConnection(agent.sock)
    try:
        conn.request(
            "POST",
            "/process.Process/StreamInput",
            body=(encode_envelope(m) for m in messages),
            headers={"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"},
        )
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    frames = []
    while raw:
        flags, size = raw[0], int.from_bytes(raw[1:5], "big")
        frames.append((flags, json.loads(raw[5 : 5 + size])))
        raw = raw[5 + size :]
    return resp.status, frames


def test_stream_input(agent: Agent) -> None:
    st = Stream(agent.sock, "Start", {"process": {"cmd": "cat"}})
    try:
        pid = st.next_event()["start"]["pid"]  # type: ignore[index]
        status, frames = stream_input(
            agent,
            [
                {"start": {"process": {"pid": pid}}},
                {"data": {"input": {"stdin": b64(b"one ")}}},
                {"keepalive": {}},
                {"data": {"input": {"stdin": b64(b"two\n")}}},
            ],
        )
        assert (status, frames) == (200, [(0, {}), (2, {})])
        out = b""
        while b"two" not in out:
            event = st.next_event()
            assert event is not None
            out += base64.b64decode(event.get("data", {}).get("stdout", ""))
        assert out == b"one two\n"
        assert unary(agent.sock, "/process.Process/CloseStdin", {"process": {"pid": pid}})[0] == 200
        assert st.collect()[1].ok
    finally:
        st.close()
    status, frames = stream_input(agent, [{"start": {"process": {"pid": 999999}}}])
    assert (status, frames) == (
        200,
        [(2, {"error": {"code": "not_found", "message": "process with pid 999999 not found"}})],
    )
    status, frames = stream_input(agent, [{"data": {"input": {"stdin": b64(b"x")}}}])
    assert frames[0][1]["error"]["code"] == "failed_precondition"
    status, _, _ = request(
        agent.sock,
        "POST",
        "/process.Process/StreamInput",
        b"{}",
        {"Content-Type": "application/json", "Authorization": basic("root")},
    )
    assert status == 415


def test_shutdown_removes_watchers(tmp_path: Any) -> None:
    target = str(tmp_path / "watched")
    os.mkdir(target)
    with running_agent(str(tmp_path)) as own:
        assert fs(own, "CreateWatcher", {"path": target})[0] == 200
        assert watched_inodes(own.pid) == {os.stat(target).st_ino}
        st = Watch(own, target)
        assert st.first() == {"start": {}}
    assert own.proc.returncode == 0
    st.close()
