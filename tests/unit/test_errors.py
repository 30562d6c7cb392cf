"""Unit tests of the exception tree and secret redaction (e2b_provider.errors)."""

from __future__ import annotations

import gc
import pickle
import uuid
from typing import Any, Callable, List, Tuple

import pytest

from e2b_provider import errors as e
from e2b_provider.cancel import CancelReason
from e2b_provider.config import DeploymentConfig
from e2b_provider.models import SandboxLimits
from e2b_provider.protocol import validate as v

SECRET = "e2b_unit_test_secret_9f8e7d6c5b4a"
TOKEN = "envd-token-unit-test-1234567890"

VALIDATION_FAILURES: List[Callable[[], Any]] = [
    lambda: v.check_name("; rm -rf /"),
    lambda: v.check_env_key("A B"),
    lambda: v.check_env({"A": "\x00"}),
    lambda: v.check_sandbox_id("a/b"),
    lambda: v.check_hostname("LOCALHOST"),
    lambda: v.check_tag("a.b"),
    lambda: v.check_path("/a/../b"),
    lambda: v.check_allow_host("https://x.com"),
    lambda: v.check_limits(SandboxLimits(cpu=0)),
    lambda: v.check_timeout(True),
    lambda: v.check_max_bytes(-1, "max_bytes"),
    lambda: DeploymentConfig("k" * 10, ""),
    lambda: DeploymentConfig.from_mapping({"nope": 1}),
    lambda: DeploymentConfig.from_env({}),
]


@pytest.mark.parametrize("fail", VALIDATION_FAILURES)
def test_every_validation_error_is_provider_error_and_value_error(fail: Callable[[], Any]) -> None:
    with pytest.raises(e.InvalidArgument) as info:
        fail()
    assert isinstance(info.value, e.E2BProviderError)
    assert isinstance(info.value, ValueError)
    assert str(info.value)


def test_tree() -> None:
    assert issubclass(e.ConfigError, e.InvalidArgument)
    for cls in (e.AuthenticationError, e.NotFound, e.Conflict):
        assert issubclass(cls, e.E2BHttpError)
    assert issubclass(e.SandboxGoneError, e.NotFound)
    assert issubclass(e.TransportTimeout, e.TransportError)
    assert issubclass(e.TransportTimeout, TimeoutError)
    assert issubclass(e.OperationTimeout, TimeoutError)
    for cls, builtin in ((e.PathNotFound, FileNotFoundError),
                         (e.NotADirectory, NotADirectoryError),
                         (e.PermissionDenied, PermissionError)):
        assert issubclass(cls, e.CommandFailed) and issubclass(cls, builtin)
    roots: Tuple[type, ...] = (
        e.E2BHttpError,
        e.TransportError,
        e.ProtocolError,
        e.RemoteError,
        e.CommandFailed,
        e.OperationTimeout,
        e.Cancelled,
        e.InvalidArgument,
    )
    for root in roots:
        assert issubclass(root, e.E2BProviderError)
    assert issubclass(e.Cancelled, Exception)  # not a BaseException like trio's


def test_http_error_keeps_fields_and_cuts_message() -> None:
    err = e.E2BHttpError(
        409,
        "x" * 1000,
        409,
        error_code="sandbox_snapshot_guest_agent_unresponsive",
        operation="POST /v2/sandboxes/abc/connect",
    )
    assert err.status == 409 and err.code == 409
    assert err.error_code == "sandbox_snapshot_guest_agent_unresponsive"
    assert err.operation == "POST /v2/sandboxes/abc/connect"
    assert err.message == "x" * 299 + "…"  # one word: cut inside it, marked
    text = str(err)
    assert "HTTP 409" in text and "POST /v2/sandboxes/abc/connect" in text
    assert "x" * 301 not in text
    assert "[sandbox_snapshot_guest_agent_unresponsive]" in text
    envd = e.NotFound(404, "process not found", "not_found", operation="process signal")
    assert envd.code == "not_found" and envd.error_code is None


def test_remote_and_command_errors_cut_their_text() -> None:
    r = e.RemoteError("deadline_exceeded", "y" * 1000)
    assert r.code == "deadline_exceeded" and r.message == "y" * 299 + "…"
    c = e.CommandFailed("cannot read /x", exit_code=2, stderr="  " + "z" * 2000 + "\n")
    assert c.exit_code == 2 and c.stderr == "z" * 499 + "…"
    assert str(c).startswith("cannot read /x: zzz")


def test_sandbox_gone_defaults() -> None:
    g = e.SandboxGoneError("E2B sandbox abc no longer exists")
    assert g.status == 404 and g.code == 404
    assert str(g) == "E2B sandbox abc no longer exists"
    g2 = e.SandboxGoneError("no token", status=201, code=None)
    assert g2.status == 201


def test_cancelled_reason() -> None:
    c = e.Cancelled(CancelReason("explicit", "user\npressed stop"))
    assert c.reason == CancelReason("explicit", "user\npressed stop")
    assert str(c) == "cancelled: user pressed stop"
    assert str(e.Cancelled()) == "cancelled"


def _all_texts(obj: Any) -> List[str]:
    texts = [str(obj), repr(obj)]
    for a in getattr(obj, "args", ()):
        texts += [str(a), repr(a)]
    for name in ("message", "stderr", "problems"):
        if hasattr(obj, name):
            texts.append(repr(getattr(obj, name)))
    return texts


def test_registered_secret_never_in_any_error() -> None:
    e.register_secret(SECRET)
    e.register_secret(TOKEN)
    leaky = f"server said: key={SECRET} token={TOKEN} done"
    errors_: List[BaseException] = [
        e.E2BProviderError(leaky),
        e.InvalidArgument(leaky),
        e.ConfigError(leaky, [leaky, "x"]),
        e.E2BHttpError(401, leaky, 401, operation="GET /v2/sandboxes"),
        e.AuthenticationError(403, leaky),
        e.NotFound(404, leaky),
        e.SandboxGoneError(leaky),
        e.Conflict(409, leaky),
        e.TransportError(leaky),
        e.TransportTimeout(leaky),
        e.ProtocolError(leaky),
        e.RemoteError("internal", leaky),
        e.CommandFailed(leaky, exit_code=1, stderr=leaky),
        e.OperationTimeout(leaky),
        e.Cancelled(CancelReason("explicit", leaky)),
        e.Cancelled(leaky),
    ]
    for err in errors_:
        for text in _all_texts(err):
            assert SECRET not in text and TOKEN not in text, (type(err), text)
        assert "***" in str(err)


def test_redact() -> None:
    e.register_secret(SECRET)
    assert e.redact(f"a{SECRET}b{SECRET}") == "a***b***"
    e.register_secret("short")  # under 6 characters: ignored, ordinary text stays readable
    assert e.redact("a short text") == "a short text"
    e.register_secret(None)
    e.register_secret("")


def test_secret_never_in_config_repr_or_errors() -> None:
    c = DeploymentConfig(SECRET, "base")
    for text in (repr(c), str(c), f"{c!r}", repr({"c": c})):
        assert SECRET not in text
    # Invalid configs, with the key in every position it could leak from.
    failures: List[Callable[[], Any]] = [
        lambda: DeploymentConfig.from_mapping({"apiKey": SECRET + "\n", "template": ""}),
        lambda: DeploymentConfig.from_mapping({"apiKey": SECRET, "template": SECRET + " x"}),
        lambda: DeploymentConfig.from_mapping({"apiKey": SECRET, SECRET: 1}),
        lambda: DeploymentConfig.from_mapping(
            {"apiKey": SECRET, "template": "t", "domain": SECRET}
        ),
        lambda: DeploymentConfig(SECRET + " ", "t"),
        lambda: DeploymentConfig(SECRET, "t", api_url=f"https://u:{SECRET}@x.com"),
        lambda: DeploymentConfig.from_env({"E2B_API_KEY": SECRET, "E2B_TIMEOUT_SECONDS": SECRET}),
        lambda: c.replace(timeout_seconds=SECRET),
    ]
    for fail in failures:
        with pytest.raises(e.ConfigError) as info:
            fail()
        for text in _all_texts(info.value):
            assert SECRET not in text, text


def test_unregistered_key_with_newline_is_not_quoted() -> None:
    key = "e2b_fresh_never_registered\nkey"
    with pytest.raises(e.ConfigError) as info:
        DeploymentConfig.from_mapping({"apiKey": key, "template": "t"})
    for text in _all_texts(info.value):
        assert "e2b_fresh" not in text


def test_validation_errors_redact_secrets() -> None:
    e.register_secret(SECRET)
    with pytest.raises(e.InvalidArgument) as info:
        v.check_name(SECRET + ";")
    assert SECRET not in str(info.value)


PICKLABLE: List[BaseException] = [
    e.E2BProviderError("root"),
    e.InvalidArgument("bad"),
    e.ConfigError("cfg", ["p1", "p2"]),
    e.E2BHttpError(500, "boom", 500, error_code="internal_server_error", operation="op"),
    e.AuthenticationError(401, "no", 401),
    e.NotFound(404, "gone", "not_found", operation="process signal"),
    e.SandboxGoneError("sandbox x no longer exists", status=201, code=None, operation="connect"),
    e.Conflict(409, "busy", 409, error_code="x"),
    e.TransportError("dropped"),
    e.TransportTimeout("slow"),
    e.ProtocolError("bad frame"),
    e.RemoteError("deadline_exceeded", "late", operation="process start"),
    e.CommandFailed("cannot read /x", exit_code=3, stderr="nope"),
    e.PathNotFound("/x does not exist", exit_code=3),
    e.NotADirectory("/x is not a directory"),
    e.PermissionDenied("permission denied: /root", exit_code=6),
    e.OperationTimeout("file op"),
    e.Cancelled(CancelReason("deadline", "too late")),
    e.Cancelled(),
    e.ProviderClosed("closed"),
    e.SandboxPaused("paused", sandbox_id="isb"),
    e.MissingAccessToken("no token", sandbox_id="isb", status=201),
]


@pytest.mark.parametrize("err", PICKLABLE, ids=lambda x: type(x).__name__)
def test_errors_pickle_round_trip(err: BaseException) -> None:
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert str(back) == str(err)
    assert back.args == err.args
    assert back.__dict__ == err.__dict__
    for attr in (
        "status",
        "code",
        "error_code",
        "message",
        "operation",
        "problems",
        "exit_code",
        "stderr",
        "reason",
    ):
        if hasattr(err, attr):
            assert getattr(back, attr) == getattr(err, attr)


def test_a_key_is_known_before_any_validator_can_quote_it() -> None:
    key = "e2b_" + uuid.uuid4().hex  # never registered before this test
    failures: List[Callable[[], Any]] = [
        lambda: DeploymentConfig(api_key=key, template=key + " "),
        lambda: DeploymentConfig(key, "t", domain=key),
        lambda: DeploymentConfig(key, "t", timeout_seconds=key),  # type: ignore[arg-type]
        lambda: DeploymentConfig(key, "t").replace(template=key + "\n"),
    ]
    for fail in failures:
        with pytest.raises(e.ConfigError) as info:
            fail()
        for text in _all_texts(info.value):
            assert key not in text, text


class _Holder:
    """Something that holds a secret."""


def _fresh_secret() -> str:
    return "tok-" + uuid.uuid4().hex


def test_secrets_are_forgotten_with_their_last_owner() -> None:
    gc.collect()
    before = e.known_secrets()
    holders = [_Holder() for _ in range(2000)]
    values = [_fresh_secret() for _ in holders]
    for holder, value in zip(holders, values):
        e.register_secret(value, owner=holder)
    assert e.known_secrets() == before + 2000
    assert e.redact(values[-1]) == "***"
    kept = holders[7]
    del holders, holder
    gc.collect()
    assert e.known_secrets() == before + 1  # bounded by what is alive, not by history
    assert e.redact(f"x{values[7]}x") == "x***x"  # a secret still held is never forgotten
    assert e.redact(values[8]) == values[8]
    del kept
    gc.collect()
    assert e.known_secrets() == before


def test_a_secret_held_twice_stays_until_both_owners_are_gone() -> None:
    value = _fresh_secret()
    a, b = _Holder(), _Holder()
    e.register_secret(value, owner=a)
    e.register_secret(value, owner=b)
    e.register_secret(value)  # no owner, but held: not pinned for ever
    del a
    gc.collect()
    assert e.redact(value) == "***"
    del b
    gc.collect()
    assert e.redact(value) == value


def test_targets_and_clients_keep_their_tokens_known_only_while_they_exist() -> None:
    from e2b_provider.clients.envd import EnvdClient
    from e2b_provider.models import Target
    from e2b_provider.transport.client import Transport

    gc.collect()
    before = e.known_secrets()
    transport = Transport()
    try:
        for _ in range(3000):  # one connect per sandbox, many sandboxes over time
            t = Target("http://127.0.0.1:9", "isb", _fresh_secret())
            EnvdClient(transport, t)
            e.register_secret(t.access_token)  # as every user of a target does
        del t
        live = Target("http://127.0.0.1:9", "isb", _fresh_secret())
        client = EnvdClient(transport, live)
        gc.collect()
        assert e.known_secrets() <= before + 1
        assert e.redact(live.access_token) == "***"
        del client
    finally:
        transport.close()


def test_unowned_secrets_are_kept() -> None:
    value = _fresh_secret()
    e.register_secret(value)
    gc.collect()
    assert e.redact(value) == "***"


def test_a_long_server_message_is_cut_after_a_whole_word() -> None:
    text = ("sandbox boot failed: sandbox abc did not boot: it made no progress for 30 s while "
            "waiting for the agent to answer GET /health; its log ends:\n" + "booting " * 100)
    err = e.E2BHttpError(500, text, 500, operation="POST /v2/sandboxes")
    assert len(err.message) <= e.MAX_MESSAGE_CHARS and err.message.endswith("booting…")
    assert text.startswith(err.message[:-1])
    assert str(err).count("booting…") == 1
