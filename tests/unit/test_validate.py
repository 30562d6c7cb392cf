"""Unit tests of input validation (e2b_provider.protocol.validate): good and bad values per
validator."""

from __future__ import annotations

import math
from typing import Any, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from e2b_provider.errors import E2BProviderError, InvalidArgument
from e2b_provider.models import SandboxLimits
from e2b_provider.protocol import validate as v

FAST = settings(max_examples=100, deadline=None, database=None)

CYRILLIC_A = "\u0430"  # looks like "a"
RLO = "\u202e"  # right-to-left override
ZWSP = "\u200b"  # zero-width space

# Values no identifier-like grammar admits.
HOSTILE = [
    "; rm -rf /",
    "$(id)",
    "`id`",
    "a b",
    "..",
    "a/../b",
    "a//b",
    "a\x00b",
    "abc\n",
    "a\nb",
    "a\x7f",
    f"a{RLO}b",
    f"a{ZWSP}b",
    f"b{CYRILLIC_A}d",
    "",
    "a|b",
    "a&b",
    "a>b",
    "'a'",
    '"a"',
    "a*",
    "a\\b",
    "a\tb",
    "é",
]


def rejects(fn: Callable[[Any], Any], value: Any) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as info:
        fn(value)
    err = info.value
    assert isinstance(err, ValueError) and isinstance(err, E2BProviderError)
    return err


# --- names, env keys, ids, tags -----------------------------------------------------------


@pytest.mark.parametrize("good", ["a", "A", "0", "my-sandbox", "a.b_c-d", "x" * 101, "9lives"])
def test_name_good(good: str) -> None:
    assert v.check_name(good) == good


@pytest.mark.parametrize(
    "bad", [*HOSTILE, "-a", ".a", "_a", "x" * 102, "a/b", "a:b", None, 1, b"abc"]
)
def test_name_bad(bad: Any) -> None:
    rejects(v.check_name, bad)


@pytest.mark.parametrize("good", ["A", "_", "_X1", "PATH", "my_var", "a" * 1024])
def test_env_key_good(good: str) -> None:
    assert v.check_env_key(good) == good


@pytest.mark.parametrize("bad", [*HOSTILE, "1A", "A-B", "A.B", "A=B", "a" * 1025, None, 3])
def test_env_key_bad(bad: Any) -> None:
    rejects(v.check_env_key, bad)


@pytest.mark.parametrize("good", ["abc", "i1x2y3z4", "A-b-0", "x" * 128, "-"])
def test_sandbox_id_good(good: str) -> None:
    assert v.check_sandbox_id(good) == good


@pytest.mark.parametrize("bad", [*HOSTILE, "a_b", "a.b", "x" * 129, "a/b", None])
def test_sandbox_id_bad(bad: Any) -> None:
    rejects(v.check_sandbox_id, bad)


@pytest.mark.parametrize("good", ["t", "holder-1", "A_b-9", "x" * 64, "_", "-"])
def test_tag_good(good: str) -> None:
    assert v.check_tag(good) == good


@pytest.mark.parametrize("bad", [*HOSTILE, "a.b", "x" * 65, "a+", "(a)", "[a]", "a?", "a^", None])
def test_tag_bad(bad: Any) -> None:
    rejects(v.check_tag, bad)


# --- env ------------------------------------------------------------------------------------


def test_env_good() -> None:
    env = {"A": "1", "B_2": "", "C": "x y; $(z) `w` é 😀"}
    out = v.check_env(env)
    assert out == env and out is not env
    assert v.check_env(None) == {}
    assert v.check_env({"V": "x" * (128 * 1024)})


@pytest.mark.parametrize(
    "bad",
    [
        {"A B": "1"},
        {"1A": "1"},
        {"A": "a\x00b"},
        {"A": 1},
        {"A": None},
        {"A": b"x"},
        {"A": "x" * (128 * 1024 + 1)},
        {"A": "é" * (64 * 1024 + 1)},  # counted in UTF-8 bytes
        {"A": "\ud800"},  # lone surrogate: not encodable
        {"A;B": "1"},
        {f"{CYRILLIC_A}": "1"},
        {1: "x"},
        ["A=1"],
        "A=1",
    ],
)
def test_env_bad(bad: Any) -> None:
    rejects(v.check_env, bad)


def test_env_too_many_variables() -> None:
    assert len(v.check_env({f"V{i}": "" for i in range(1000)})) == 1000
    rejects(v.check_env, {f"V{i}": "" for i in range(1001)})


def test_env_value_never_quoted() -> None:
    err = rejects(v.check_env, {"TOKEN": "hunter2-secret\x00"})
    assert "hunter2" not in str(err)
    assert "TOKEN" in str(err)


# --- host names -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "good", ["e2b.app", "a.b", "x-1.example.co", "1.2.3.4", ("a" * 63 + ".") * 3 + "a" * 61]
)
def test_hostname_good(good: str) -> None:
    assert v.check_hostname(good) == good


@pytest.mark.parametrize(
    "bad",
    [
        *HOSTILE,
        "localhost",
        "E2B.app",
        "-a.b",
        "a-.b",
        "a..b",
        ".a.b",
        "a.b.",
        "a_b.c",
        "*.a.b",
        "a.b:443",
        "https://a.b",
        "a" * 64 + ".b",
        ("a" * 63 + ".") * 4 + "a",  # 256 chars
        f"{CYRILLIC_A}.b",
        "e2b.app\n",
        None,
    ],
)
def test_hostname_bad(bad: Any) -> None:
    rejects(v.check_hostname, bad)


# --- paths ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "good",
    [
        "/",
        "/workspace",
        "/a/b/c.txt",
        "/a/.hidden",
        "/a/..b",
        "/a/b..",
        "/with space/x",
        "/tmp/$(id)",  # passed as an argv word, never through a shell
        "/tmp/; rm -rf ~",
        "/é/😀",
        "/" + "x" * 255,
        "/" + "/".join(["y" * 255] * 16),  # 4096 bytes
    ],
)
def test_path_good(good: str) -> None:
    assert v.path_problems(good) == []
    assert v.check_path(good) == good


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "relative",
        "./a",
        "a/b",
        "/a/../b",
        "/..",
        "/.",
        "/a/.",
        "/a/./b",
        "//",
        "//a",
        "/a//b",
        "/a/",
        "/a\x00b",
        "/a\nb",
        "/a\rb",
        "/a\tb",
        "/a\x7f",
        "/a\x1b[31m",
        f"/a{RLO}txt.exe",
        f"/a{ZWSP}b",
        "/a\u2028b",
        "/a\u2029b",
        "/a\ufeffb",
        "/a\x85b",
        "/\ud800",
        "/" + "x" * 256,
        "/" + "é" * 128,  # 256 bytes in one component
        "/" + "/".join(["y" * 255] * 16) + "/z",  # 4098 bytes
        None,
        b"/a",
        1,
    ],
)
def test_path_bad(bad: Any) -> None:
    assert v.path_problems(bad)
    err = rejects(v.check_path, bad)
    assert "invalid sandbox path" in str(err)


def test_path_lists_every_problem() -> None:
    problems = v.path_problems("a//b/../\x00")
    assert len(problems) >= 4
    text = "; ".join(problems)
    for word in ("absolute", "NUL", "//", "'..'"):
        assert word in text


# --- egress allowlist entries ---------------------------------------------------------------


@pytest.mark.parametrize(
    "good",
    [
        "example.com",
        "api.openai.com",
        "*.x.com",
        "*.a.b.c",
        "x-y.z9.io",
        "10.0.0.0/8",
        "8.8.8.8/32",
        "8.8.8.8",
        "0.0.0.0/0",
        "::1",
        "2001:db8::/32",
        "2001:db8::1",
        "::ffff:10.0.0.1",
        "::/0",
    ],
)
def test_allow_host_good(good: str) -> None:
    assert v.allow_host_problems(good) == []
    assert v.check_allow_host(good) == good


@pytest.mark.parametrize(
    "bad",
    [
        *HOSTILE,
        "https://x.com",
        "http://x.com/",
        "x.com:443",
        "x.com/path",
        "x.com?q",
        "x.com#f",
        "user@x.com",
        " x.com",
        "x.com ",
        "x.com\n",
        "X.com",
        "*",
        "*.com",
        "a.*.com",
        "*x.com",
        "**.x.com",
        "x",
        "localhost",
        f"ex{CYRILLIC_A}mple.com",
        "xn--80a.com.\u0430",
        "10.0.0.1/8",  # host bits set
        "10.0.0.0/33",
        "10.0.0.0/x",
        "10.0.0.0/",
        "1.2.3.999",
        "1.2.3",
        "010.0.0.1",
        "fe80::1%eth0",
        "[::1]",
        "[::1]:443",
        ":::1",
        "x" * 300,
        ("a" * 63 + ".") * 4 + "a",
        None,
        3,
    ],
)
def test_allow_host_bad(bad: Any) -> None:
    assert v.allow_host_problems(bad)
    err = rejects(v.check_allow_host, bad)
    assert "allowHosts" in str(err)


@FAST
@given(st.text(max_size=40))
def test_allow_host_never_crashes_and_good_hosts_are_ascii(text: str) -> None:
    problems = v.allow_host_problems(text)
    if not problems:
        assert text.isascii() and text == text.strip() and "//" not in text


@FAST
@given(st.text(max_size=40))
def test_path_never_crashes(text: str) -> None:
    problems = v.path_problems(text)
    if not problems:
        assert text.startswith("/") and "\x00" not in text and "/../" not in text + "/"


# --- limits ---------------------------------------------------------------------------------


def test_limits_good() -> None:
    for lim in (
        SandboxLimits(),
        SandboxLimits(cpu=0.5, memory_mb=1, disk_mb=1.5),  # type: ignore[arg-type]
        SandboxLimits(egress="open"),
        SandboxLimits(egress="allowlist", allow_hosts=["x.com", "*.y.org", "10.0.0.0/8"]),
        SandboxLimits(egress="allowlist", allow_hosts=[f"h{i}.com" for i in range(256)]),
        # Hosts are only checked for "allowlist".
        SandboxLimits(egress="none", allow_hosts=["not a host"]),
    ):
        assert v.check_limits(lim) is lim


@pytest.mark.parametrize(
    "changes",
    [
        {"cpu": 0},
        {"cpu": -1},
        {"cpu": True},
        {"cpu": math.nan},
        {"cpu": math.inf},
        {"cpu": "1"},
        {"memory_mb": 0},
        {"memory_mb": False},
        {"memory_mb": -math.inf},
        {"disk_mb": math.nan},
        {"disk_mb": "4096"},
        {"egress": "allow"},
        {"egress": "OPEN"},
        {"egress": None},
        {"egress": "allowlist", "allow_hosts": ["https://x.com"]},
        {"egress": "allowlist", "allow_hosts": ["x.com", "x.com:443"]},
        {"egress": "allowlist", "allow_hosts": [f"ex{CYRILLIC_A}mple.com"]},
        {"egress": "allowlist", "allow_hosts": [f"h{i}.com" for i in range(257)]},
        {"egress": "allowlist", "allow_hosts": [None]},
    ],
)
def test_limits_bad(changes: Any) -> None:
    rejects(v.check_limits, SandboxLimits(**changes))


def test_limits_wrong_type() -> None:
    rejects(v.check_limits, {"cpu": 1})


# --- timeouts and byte bounds ---------------------------------------------------------------


@pytest.mark.parametrize("good", [0.001, 1, 30.0, 86400, 86400.0])
def test_timeout_good(good: Any) -> None:
    out = v.check_timeout(good)
    assert out == good and isinstance(out, float)


@pytest.mark.parametrize(
    "bad", [0, -1, 0.0, -0.0, math.nan, math.inf, -math.inf, True, False, "30", None, 86400.5]
)
def test_timeout_bad(bad: Any) -> None:
    err = rejects(lambda x: v.check_timeout(x, name="exec timeout"), bad)
    assert "exec timeout" in str(err)


@pytest.mark.parametrize("good", [0, 1, 1 << 20, 1 << 30])
def test_max_bytes_good(good: int) -> None:
    assert v.check_max_bytes(good, "max_bytes") == good


@pytest.mark.parametrize("bad", [-1, (1 << 30) + 1, 1.0, True, False, "10", None, math.nan])
def test_max_bytes_bad(bad: Any) -> None:
    err = rejects(lambda x: v.check_max_bytes(x, "max_output_bytes"), bad)
    assert "max_output_bytes" in str(err)


# --- messages -------------------------------------------------------------------------------


def test_message_quotes_value_with_repr_cut_to_80() -> None:
    err = rejects(v.check_name, "$(id)")
    assert "'$(id)'" in str(err)
    long = "!" * 500
    err = rejects(v.check_name, long)
    quoted = str(err).split("sandbox name ", 1)[1].split(":", 1)[0]
    assert len(quoted) <= 80 and quoted.startswith("'!!!")
    assert v.show("x" * 10) == repr("x" * 10)
    assert len(v.show("x" * 1000)) == 80


def test_show_keeps_a_repr_of_exactly_80_characters_whole() -> None:
    assert v.show("a" * 78) == "'" + "a" * 78 + "'"  # repr: 80 characters
    assert v.show("a" * 79) == "'" + "a" * 76 + "..."  # 81: cut to 77 and "..."


NAME_253 = ".".join(["a" * 63] * 3 + ["b" * 61])  # the longest host name allowed
GRAMMAR_HOST = (
    "must be a lowercase DNS name with at least two labels of ASCII letters, digits and '-' "
    "(no leading or trailing '-'), such as e2b.app"
)
MAX_BYTES = lambda n: v.check_max_bytes(n, "max_bytes")  # noqa: E731

# What the caller reads: the value (repr, cut to 80 characters) and every problem with it.
MESSAGES = [
    (v.check_name, 5, "invalid sandbox name: must be a string, not int"),
    (v.check_name, "-a", "invalid sandbox name '-a': must be 1-101 ASCII letters, digits, "
     "'_', '.' or '-', starting with a letter or digit"),
    (v.check_env_key, 1, "invalid environment variable name: must be a string, not int"),
    (v.check_env_key, "A" * 1025, f"invalid environment variable name {v.show('A' * 1025)}: "
     "longer than 1024 characters"),
    (v.check_env_key, "1A", "invalid environment variable name '1A': must be ASCII letters, "
     "digits and '_', not starting with a digit"),
    (v.check_env, ["A"], "invalid env: must be a mapping, not list"),
    (v.check_env, {"A": 1}, "invalid value for environment variable A: must be a string, "
     "not int"),
    (v.check_env, {"A": "a\x00"}, "invalid value for environment variable A: contains a NUL "
     "character"),
    (v.check_env, {"A": "\ud800"}, "invalid value for environment variable A: not encodable "
     "as UTF-8"),
    (v.check_env, {"A": "é" * 65537}, "invalid value for environment variable A: 131074 "
     "bytes, at most 131072 are allowed"),
    (v.check_sandbox_id, "a b", "invalid E2B sandbox id 'a b': must be 1-128 ASCII letters, "
     "digits or '-'"),
    (v.check_sandbox_id, None, "invalid E2B sandbox id: must be a string, not NoneType"),
    (v.check_hostname, 1, "invalid host name: must be a string, not int"),
    (v.check_hostname, "E2B.app", f"invalid host name 'E2B.app': {GRAMMAR_HOST}"),
    (v.check_hostname, "a" * 64 + ".app", f"invalid host name {v.show('a' * 64 + '.app')}: "
     "has a label longer than 63 characters"),
    (v.check_hostname, NAME_253 + "c", f"invalid host name {v.show(NAME_253 + 'c')}: longer "
     "than 253 characters"),
    (v.check_hostname, "X" + NAME_253, f"invalid host name {v.show('X' + NAME_253)}: longer "
     f"than 253 characters; {GRAMMAR_HOST}"),
    (v.check_tag, "a b", "invalid sandbox tag 'a b': must be 1-64 ASCII letters, digits, '_' "
     "or '-'"),
    (v.check_tag, 1, "invalid sandbox tag: must be a string, not int"),
    (v.check_path, 1, "invalid sandbox path 1: must be a string, not int"),
    (v.check_path, "", "invalid sandbox path '': must not be empty"),
    (v.check_path, "a//b/./", "invalid sandbox path 'a//b/./': must be absolute (start with "
     "'/'); must not contain empty segments ('//'); must not end with '/'; must be normalized "
     "(no '.' or '..' segments)"),
    (v.check_path, "/a\x00", "invalid sandbox path '/a\\x00': must not contain NUL"),
    (v.check_path, "/a\x00\x01", "invalid sandbox path '/a\\x00\\x01': must not contain NUL; "
     "must not contain control or invisible formatting characters"),
    (v.check_path, "/\ud800", "invalid sandbox path '/\\ud800': must be valid Unicode (no "
     "lone surrogates)"),
    (v.check_path, "//", "invalid sandbox path '//': must not contain empty segments ('//'); "
     "must not end with '/'"),
    (v.check_allow_host, 1, "invalid allowHosts entry 1: must be a string, not int"),
    (v.check_allow_host, "", "invalid allowHosts entry '': must not be empty"),
    (v.check_allow_host, "x" * 256, f"invalid allowHosts entry {v.show('x' * 256)}: longer "
     "than 253 characters"),
    (v.check_allow_host, f"{CYRILLIC_A} b{ZWSP}.com", "invalid allowHosts entry "
     f"'{CYRILLIC_A} b\\u200b.com': must be ASCII only (no Unicode look-alike characters); must "
     "not contain whitespace; must not contain control or invisible formatting characters"),
    (v.check_allow_host, "https://x.com", "invalid allowHosts entry 'https://x.com': must not "
     "include a scheme such as https://"),
    (v.check_allow_host, "a!b.com", "invalid allowHosts entry 'a!b.com': may contain only "
     "ASCII letters, digits, '.', '-', a leading '*.', and ':' or '/' in IP addresses and CIDR "
     "blocks"),
    (v.check_allow_host, "10.0.0.0/x", "invalid allowHosts entry '10.0.0.0/x': CIDR prefix "
     "length must be a decimal number"),
    (v.check_allow_host, "10.0.0.0/8/9", "invalid allowHosts entry '10.0.0.0/8/9': CIDR "
     "prefix length must be a decimal number"),
    (v.check_allow_host, "10.0.0.1/8", "invalid allowHosts entry '10.0.0.1/8': CIDR has host "
     "bits set (use the network address)"),
    (v.check_allow_host, "10.0.0.0/33", "invalid allowHosts entry '10.0.0.0/33': not a valid "
     "CIDR block"),
    (v.check_allow_host, "999.1.1.1", "invalid allowHosts entry '999.1.1.1': not a valid IPv4 "
     "address"),
    (v.check_allow_host, "x.com/p", "invalid allowHosts entry 'x.com/p': must not include a "
     "path"),
    (v.check_allow_host, "x.com:80", "invalid allowHosts entry 'x.com:80': must not include a "
     "port"),
    (v.check_allow_host, "*.*.com", "invalid allowHosts entry '*.*.com': a wildcard is only "
     "allowed as a leading '*.'"),
    (v.check_allow_host, "X.com", "invalid allowHosts entry 'X.com': must be lowercase"),
    (v.check_allow_host, "a.b.123", "invalid allowHosts entry 'a.b.123': looks like an IPv4 "
     "address but is not a valid one"),
    (v.check_allow_host, "x_y.com", f"invalid allowHosts entry 'x_y.com': {GRAMMAR_HOST}"),
    (v.check_limits, {}, "invalid sandbox limits: must be SandboxLimits, not dict"),
    (v.check_limits, SandboxLimits(cpu=True), "invalid sandbox limits: cpu must be a positive "
     "finite number, not True"),
    (v.check_limits, SandboxLimits(egress="all"), "invalid sandbox limits: egress must be one "
     "of 'none', 'allowlist', 'open', not 'all'"),
    (v.check_timeout, "1", "invalid timeout '1': must be a positive finite number of seconds"),
    (v.check_timeout, 86401, "invalid timeout 86401: at most 86400 seconds"),
    (MAX_BYTES, 1.0, "invalid max_bytes 1.0: must be an int"),
    (MAX_BYTES, -1, "invalid max_bytes -1: must not be negative"),
    (MAX_BYTES, 2**30 + 1, "invalid max_bytes 1073741825: at most 1073741824 (1 GiB)"),
]  # fmt: skip


@pytest.mark.parametrize("check, value, message", MESSAGES)
def test_message_names_the_value_and_every_problem(
    check: Callable[[Any], Any], value: Any, message: str
) -> None:
    assert str(rejects(check, value)) == message


def test_allow_host_length_bound_counts_the_wildcard() -> None:
    # "*." plus the longest host name is 255 characters and fine; 256 is refused at once
    assert v.check_allow_host("*." + NAME_253) == "*." + NAME_253
    assert v.allow_host_problems("x" * 256) == ["longer than 253 characters"]


def test_message_shows_invisible_characters_escaped() -> None:
    err = rejects(v.check_tag, f"a{RLO}b")
    assert "\\u202e" in str(err) and RLO not in str(err)


@pytest.mark.parametrize(
    "module",
    [
        "protocol/validate.py",
        "config.py",
        "protocol/process_events.py",
        "protocol/connect.py",
        "cancel.py",
        "core/messages.py",
    ],
)
def test_pure_modules_import_no_network_stack(module: str) -> None:
    import ast
    import pathlib

    import e2b_provider

    source = (pathlib.Path(e2b_provider.__file__).parent / module).read_text("utf-8")
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imported.add(node.module.split(".")[0])
    assert not imported & {"requests", "urllib3", "socket", "http", "ssl"}


def _refusal(call: Callable[[], object]) -> str:
    with pytest.raises(InvalidArgument) as ei:
        call()
    return str(ei.value)


def test_check_text_says_what_and_why() -> None:
    assert v.check_text("echo é", "command") == "echo é"
    assert _refusal(lambda: v.check_text(5, "command")) == (
        "invalid command: must be a string, not int"
    )
    assert _refusal(lambda: v.check_text("a\x00b", "command")) == (
        "invalid command: contains a NUL character"
    )
    # the first lone surrogate is named by index, from both ends of the surrogate range
    # (a character just above it, U+E000, is fine)
    for text, index, char in [("ab\ud800", 2, "'\\ud800'"), ("\ue000\udfff\ud800", 1,
                              "'\\udfff'")]:  # fmt: skip
        assert _refusal(lambda t=text: v.check_text(t, "command")) == (
            f"invalid command: not encodable as UTF-8 (a lone surrogate {char} at index "
            f"{index}, as os.fsdecode() gives for bytes that are not UTF-8); pass text, or "
            "decode the bytes with errors='replace'"
        )
    # the size is in UTF-8 bytes, and the bound itself is allowed
    assert v.check_text("é" * 5, "command", max_bytes=10) == "é" * 5
    assert _refusal(lambda: v.check_text("é" * 5 + "x", "command", max_bytes=10)) == (
        "invalid command: 11 bytes in UTF-8, at most 10"
    )


def test_cancel_must_be_a_token_or_none() -> None:
    from e2b_provider import CancelToken
    from e2b_provider.errors import Cancelled

    token = CancelToken()
    assert v.check_cancel(None) is None and v.check_cancel(token) is token
    for bad in (5, "now", object(), True, lambda: None):
        with pytest.raises(InvalidArgument, match="cancel must be a CancelToken or None"):
            v.check_cancel(bad)
    token.cancel()
    with pytest.raises(Cancelled):
        v.check_cancel(token)
