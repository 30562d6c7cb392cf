"""Unit tests of input validation (e2b_provider._validate): good and bad values per validator."""

from __future__ import annotations

import math
from typing import Any, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from e2b_provider import _validate as v
from e2b_provider.errors import E2BProviderError, InvalidArgument
from e2b_provider.models import SandboxLimits

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
        {"cpu": None},
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


def test_message_shows_invisible_characters_escaped() -> None:
    err = rejects(v.check_tag, f"a{RLO}b")
    assert "\\u202e" in str(err) and RLO not in str(err)


@pytest.mark.parametrize(
    "module",
    ["_validate.py", "config.py", "_process.py", "_connect.py", "cancel.py", "_messages.py"],
)
def test_pure_modules_import_no_network_stack(module: str) -> None:
    import ast
    import pathlib

    import e2b_provider

    source = pathlib.Path(e2b_provider.__file__).with_name(module).read_text("utf-8")
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imported.add(node.module.split(".")[0])
    assert not imported & {"requests", "urllib3", "socket", "http", "ssl"}
