"""Unit tests of the deployment configuration (e2b_provider.config)."""

from __future__ import annotations

import pickle
import uuid
from typing import Any, Dict

import attrs
import pytest

from e2b_provider.config import (
    EXTENSION_NAME,
    DeploymentConfig,
    config_schema,
)
from e2b_provider.errors import ConfigError, E2BProviderError, InvalidArgument, redact

KEY = "e2b_0123456789abcdef-config-test"


def cfg(**kw: Any) -> DeploymentConfig:
    return DeploymentConfig(KEY, "base", **kw)


def bad(**kw: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        cfg(**kw)
    return info.value


def test_defaults() -> None:
    c = cfg()
    assert c.api_key == KEY and c.template == "base"
    assert c.api_url is None
    assert c.domain == "e2b.app"
    assert c.timeout_seconds == 3600
    assert c.domain_allowlist is True
    assert c.allow_open_egress is False
    assert c.sandbox_url is None
    assert c.effective_api_url == "https://api.e2b.app"
    assert cfg(domain="example.org").effective_api_url == "https://api.example.org"


def test_field_order_and_keyword_only_rest() -> None:
    assert [a.name for a in attrs.fields(DeploymentConfig)][:2] == ["api_key", "template"]
    with pytest.raises(TypeError):
        DeploymentConfig(KEY, "base", None)  # type: ignore[call-arg]
    assert DeploymentConfig(api_key=KEY, template="t").template == "t"


def test_frozen() -> None:
    c = cfg()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        c.template = "x"  # type: ignore[misc]


def test_labels_are_metadata() -> None:
    meta = {a.name: a.metadata for a in attrs.fields(DeploymentConfig)}
    assert meta["api_key"]["label"] == {"zh": "API 密钥", "en": "API key"}
    assert meta["timeout_seconds"]["label"] == {"zh": "沙箱超时", "en": "Sandbox timeout"}
    assert meta["api_key"]["secret"] is True
    for m in meta.values():
        assert set(m["label"]) == {"zh", "en"}


# --- every field's bounds -------------------------------------------------------------------


@pytest.mark.parametrize("good", [60, 61, 3600, 86400])
def test_timeout_bounds_good(good: int) -> None:
    assert cfg(timeout_seconds=good).timeout_seconds == good


@pytest.mark.parametrize("value", [59, 86401, 0, -1, 3600.0, "3600", True, None])
def test_timeout_bounds_bad(value: Any) -> None:
    err = bad(timeout_seconds=value)
    assert isinstance(err, ValueError) and err.problems
    assert err.problems[0].startswith("timeout_seconds:")


@pytest.mark.parametrize("value", [0, 1, "true", None])
def test_bools_are_strict(value: Any) -> None:
    bad(domain_allowlist=value)
    bad(allow_open_egress=value)


def test_bools_good() -> None:
    c = cfg(domain_allowlist=False, allow_open_egress=True)
    assert (c.domain_allowlist, c.allow_open_egress) == (False, True)


@pytest.mark.parametrize("good", ["e2b.app", "e2b.dev", "my-e2b.example.com", "a.b"])
def test_domain_good(good: str) -> None:
    assert cfg(domain=good).domain == good


@pytest.mark.parametrize(
    "value",
    [
        "E2B.app",
        "localhost",
        "e2b.app.",
        "e2b.app\n",
        "https://e2b.app",
        "e2b.app:443",
        "e2\u0430.app",
        "",
        3,
        None,
    ],
)
def test_domain_bad(value: Any) -> None:
    bad(domain=value)


@pytest.mark.parametrize("good", ["base", "my-template:v2", "x" * 256, "abc123_def"])
def test_template_good(good: str) -> None:
    assert DeploymentConfig(KEY, good).template == good


@pytest.mark.parametrize("value", ["", "x" * 257, "a b", "a\n", "\tx", "a\u200bb", None, 1])
def test_template_bad(value: Any) -> None:
    with pytest.raises(ConfigError):
        DeploymentConfig(KEY, value)


@pytest.mark.parametrize("value", ["a\ud800", "\udfffb", "a\udbff\udc00"])
def test_template_with_a_lone_surrogate_is_refused(value: str) -> None:
    # both ends of the surrogate range (and a pair that Python left unjoined)
    with pytest.raises(ConfigError) as ei:
        DeploymentConfig(KEY, value)
    assert str(ei.value) == (
        "invalid sandbox-e2b deployment config: template: must be valid Unicode text (no lone "
        f"surrogates): {value!r}"
    )


@pytest.mark.parametrize("value", ["a\ud7ff", "\ue000b", "\U0001f600"])
def test_template_beside_the_surrogate_range_is_fine(value: str) -> None:
    assert DeploymentConfig(KEY, value).template == value


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("https://api.example.com", "https://api.example.com"),
        ("https://api.example.com/", "https://api.example.com"),
        ("http://127.0.0.1:8080//", "http://127.0.0.1:8080"),
        ("http://[::1]:8080/e2b/", "http://[::1]:8080/e2b"),
        ("HTTPS://Api.Example.com", "HTTPS://Api.Example.com"),
    ],
)
def test_urls_good(given: str, stored: str) -> None:
    c = cfg(api_url=given, sandbox_url=given)
    assert c.api_url == stored and c.sandbox_url == stored
    assert c.effective_api_url == stored


@pytest.mark.parametrize(
    "value",
    [
        "",
        "api.example.com",
        "ftp://x.com",
        "file:///etc/passwd",
        "https://",
        "https:///path",
        "https://user:pw@x.com",
        "https://x.com?key=1",
        "https://x.com/#frag",
        "https://x.com:99999",
        "https://x.com:0",
        "https://x.com:abc",
        "https://x .com",
        "https://x.com\n",
        "https://\u0430pi.com",
        "javascript:alert(1)",
        "x" * 3000,
        3,
    ],
)
def test_urls_bad(value: Any) -> None:
    bad(api_url=value)
    bad(sandbox_url=value)


def test_url_problems_never_quote_the_url() -> None:
    err = bad(api_url="https://user:hunter2pw@x.com")
    assert "hunter2pw" not in str(err)
    err = bad(sandbox_url="https://x.com/?token=abcdef123")
    assert "abcdef123" not in str(err)


@pytest.mark.parametrize(
    "value", ["", "with space", "nl\n", "tab\tkey", "nul\x00", "\u200bzw", "k\u00e9y", None, 123]
)
def test_api_key_bad(value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        DeploymentConfig(value, "base")
    if isinstance(value, str) and value:
        assert value not in str(info.value)


# --- from_mapping ----------------------------------------------------------------------------


CAMEL: Dict[str, Any] = {
    "apiKey": KEY,
    "apiUrl": "https://api.example.com/",
    "domain": "example.com",
    "template": "base",
    "timeoutSeconds": 600,
    "domainAllowlist": False,
    "allowOpenEgress": True,
    "sandboxUrl": "http://127.0.0.1:9000",
}
SNAKE = {
    "api_key": KEY,
    "api_url": "https://api.example.com/",
    "domain": "example.com",
    "template": "base",
    "timeout_seconds": 600,
    "domain_allowlist": False,
    "allow_open_egress": True,
    "sandbox_url": "http://127.0.0.1:9000",
}


def test_from_mapping_camel_and_snake_agree() -> None:
    a = DeploymentConfig.from_mapping(CAMEL)
    b = DeploymentConfig.from_mapping(SNAKE)
    assert a == b
    assert a.api_url == "https://api.example.com"
    assert a.timeout_seconds == 600 and a.domain_allowlist is False
    assert a.allow_open_egress is True and a.sandbox_url == "http://127.0.0.1:9000"


def test_from_mapping_minimal_and_null_optionals() -> None:
    c = DeploymentConfig.from_mapping({"apiKey": KEY, "template": "t", "apiUrl": None})
    assert c == DeploymentConfig(KEY, "t")


def test_from_mapping_unknown_key() -> None:
    with pytest.raises(ConfigError) as info:
        DeploymentConfig.from_mapping({**CAMEL, "apikey": "x", "timeout": 5})
    assert set(info.value.problems) == {"unknown key 'apikey'", "unknown key 'timeout'"}


def test_from_mapping_duplicate_spellings() -> None:
    with pytest.raises(ConfigError) as info:
        DeploymentConfig.from_mapping({**CAMEL, "timeout_seconds": 600})
    (problem,) = info.value.problems
    assert "timeoutSeconds" in problem and "timeout_seconds" in problem


def test_from_mapping_missing_required() -> None:
    with pytest.raises(ConfigError) as info:
        DeploymentConfig.from_mapping({})
    assert set(info.value.problems) == {"apiKey: required", "template: required"}


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("timeoutSeconds", "3600"),
        ("timeoutSeconds", 3600.0),
        ("timeoutSeconds", True),
        ("domainAllowlist", 1),
        ("domainAllowlist", "false"),
        ("allowOpenEgress", 0),
        ("template", 5),
        ("domain", None),
        ("apiUrl", 5),
    ],
)
def test_from_mapping_strict_types(key: str, value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        DeploymentConfig.from_mapping({**CAMEL, key: value})
    (problem,) = info.value.problems
    assert problem.startswith(f"{key}:")


def test_from_mapping_reports_every_invalid_field_in_one_error() -> None:
    secret = "e2b_top\nsecret_value"
    m = {
        "apiKey": secret,
        "apiUrl": "ftp://x",
        "domain": "BAD",
        "template": "",
        "timeoutSeconds": 5,
        "domainAllowlist": "yes",
        "allowOpenEgress": None,
        "sandboxUrl": "https://x.com?q=1",
        "extra": 1,
        "api_key": "dup",
    }
    with pytest.raises(ConfigError) as info:
        DeploymentConfig.from_mapping(m)
    err = info.value
    labels = {p.split(":")[0].split(" ")[0] for p in err.problems}
    assert labels >= {
        "apiKey",
        "apiUrl",
        "domain",
        "template",
        "timeoutSeconds",
        "domainAllowlist",
        "allowOpenEgress",
        "sandboxUrl",
        "unknown",
    }
    assert len(err.problems) == 10
    assert "apiKey: must be a non-empty string without whitespace or control characters" in (
        err.problems
    )
    for text in (str(err), repr(err), *map(str, err.args), *err.problems):
        assert "secret_value" not in text and "e2b_top" not in text


def test_from_mapping_not_a_mapping() -> None:
    with pytest.raises(ConfigError):
        DeploymentConfig.from_mapping([("apiKey", KEY)])  # type: ignore[arg-type]


def test_from_mapping_non_string_key() -> None:
    with pytest.raises(ConfigError) as info:
        DeploymentConfig.from_mapping({**CAMEL, 1: "x"})  # type: ignore[dict-item]
    assert info.value.problems == ("unknown key 1",)


# --- from_env ----------------------------------------------------------------------------------


def test_from_env_reads_variables() -> None:
    env = {
        "E2B_API_KEY": KEY,
        "E2B_API_URL": "http://127.0.0.1:1234/",
        "E2B_DOMAIN": "example.com",
        "E2B_SANDBOX_URL": "http://127.0.0.1:1235",
        "E2B_TEMPLATE": "tpl",
        "E2B_TIMEOUT_SECONDS": "120",
        "UNRELATED": "x",
    }
    c = DeploymentConfig.from_env(env)
    assert c == DeploymentConfig(
        KEY,
        "tpl",
        api_url="http://127.0.0.1:1234",
        domain="example.com",
        sandbox_url="http://127.0.0.1:1235",
        timeout_seconds=120,
    )


def test_from_env_empty_strings_are_unset_and_overrides_win() -> None:
    env = {"E2B_API_KEY": KEY, "E2B_TEMPLATE": "tpl", "E2B_API_URL": "", "E2B_DOMAIN": ""}
    c = DeploymentConfig.from_env(env, template="other", allowOpenEgress=True)
    assert c.template == "other" and c.allow_open_egress is True
    assert c.api_url is None and c.domain == "e2b.app"


def test_from_env_uses_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("E2B_API_KEY", KEY)
    monkeypatch.setenv("E2B_TEMPLATE", "from-os")
    monkeypatch.delenv("E2B_TIMEOUT_SECONDS", raising=False)
    assert DeploymentConfig.from_env().template == "from-os"


@pytest.mark.parametrize("value", ["abc", "3600.0", "1e3", "-60", "0x100", "٣٦٠٠"])
def test_from_env_bad_timeout(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        DeploymentConfig.from_env(
            {"E2B_API_KEY": KEY, "E2B_TEMPLATE": "t", "E2B_TIMEOUT_SECONDS": value}
        )
    assert info.value.problems[0].startswith("E2B_TIMEOUT_SECONDS:")


def test_from_env_missing_and_invalid_all_reported() -> None:
    with pytest.raises(ConfigError) as info:
        DeploymentConfig.from_env({"E2B_DOMAIN": "NOPE", "E2B_TIMEOUT_SECONDS": "30"}, bogus=1)
    problems = info.value.problems
    assert "apiKey: required (set E2B_API_KEY)" in problems
    assert "template: required (set E2B_TEMPLATE)" in problems
    assert any(p.startswith("E2B_DOMAIN:") for p in problems)
    assert any(p.startswith("E2B_TIMEOUT_SECONDS:") for p in problems)
    assert "unknown key 'bogus'" in problems


def test_from_env_duplicate_override_spellings() -> None:
    with pytest.raises(ConfigError):
        DeploymentConfig.from_env({}, api_key=KEY, apiKey=KEY, template="t")


# --- repr, replace, schema --------------------------------------------------------------------


def test_repr_and_str_hide_the_key() -> None:
    c = cfg()
    assert repr(c) == (
        "DeploymentConfig(api_key='***', template='base', api_url=None, domain='e2b.app', "
        "timeout_seconds=3600, domain_allowlist=True, allow_open_egress=False, sandbox_url=None)"
    )
    for text in (repr(c), str(c), f"{c}", repr([c])):
        assert KEY not in text
        assert "api_key='***'" in text
        assert "template='base'" in text


def test_replace_validates() -> None:
    c = cfg()
    d = c.replace(timeout_seconds=120, domain="x.org")
    assert (d.timeout_seconds, d.domain, d.api_key) == (120, "x.org", KEY)
    assert c.timeout_seconds == 3600
    with pytest.raises(ConfigError):
        c.replace(timeout_seconds=1)
    with pytest.raises(ConfigError):
        c.replace(timeoutSeconds=120)
    with pytest.raises(ConfigError):
        c.replace(nope=1)


def test_pickle_round_trip() -> None:
    c = cfg(api_url="http://h.example:1")
    assert pickle.loads(pickle.dumps(c)) == c


def test_config_errors_are_value_errors() -> None:
    err = bad(timeout_seconds=1)
    assert isinstance(err, InvalidArgument) and isinstance(err, E2BProviderError)


def test_extension_name() -> None:
    assert EXTENSION_NAME == "sandbox-e2b"


def test_config_schema() -> None:
    s = config_schema()
    assert s["type"] == "object" and s["additionalProperties"] is False
    assert set(s["required"]) == {"apiKey", "template"}
    props = s["properties"]
    assert set(props) == set(CAMEL)
    assert props["apiKey"]["secret"] is True and props["apiKey"]["type"] == "string"
    assert all("secret" not in p for k, p in props.items() if k != "apiKey")
    assert props["timeoutSeconds"] == {
        **props["timeoutSeconds"],
        "type": "integer",
        "minimum": 60,
        "maximum": 86400,
        "default": 3600,
    }
    assert props["domain"]["default"] == "e2b.app"
    assert props["domainAllowlist"]["default"] is True
    assert props["allowOpenEgress"]["default"] is False
    assert "default" not in props["apiUrl"] and "default" not in props["apiKey"]
    assert props["allowOpenEgress"]["label"] == {"zh": "允许开放出站", "en": "Allow open egress"}
    for p in props.values():
        assert p["label"]["en"] and p["label"]["zh"] and p["description"]
    # A fresh copy each time: callers may mutate theirs.
    s["properties"]["apiKey"]["label"]["en"] = "changed"
    assert config_schema()["properties"]["apiKey"]["label"]["en"] == "API key"


# --- messages: what each refused value is told -------------------------------------------------

URL_2048 = "http://h.example/" + "a" * (2048 - len("http://h.example/"))

FIELD_PROBLEMS = [
    ({"api_url": ""}, "api_url: must be an http or https URL of 1-2048 characters"),
    ({"api_url": URL_2048 + "a"}, "api_url: must be an http or https URL of 1-2048 characters"),
    ({"api_url": "https://x .com"},
     "api_url: must not contain whitespace, control or non-ASCII characters"),
    ({"api_url": "https://x.com:abc"}, "api_url: is not a valid URL (bad host or port)"),
    ({"api_url": "ftp://x.com"}, "api_url: must start with http:// or https://"),
    ({"api_url": "https://u:p@x.com"}, "api_url: must not contain user info (user:password@)"),
    ({"api_url": "https:///p"}, "api_url: must name a host"),
    ({"api_url": "https://x.com:0"}, "api_url: must not use port 0"),
    ({"api_url": "https://x.com?"}, "api_url: must not contain a query string"),
    ({"sandbox_url": "https://x.com#"}, "sandbox_url: must not contain a fragment"),
    ({"sandbox_url": 3}, "sandbox_url: must be an http or https URL string, not int"),
    ({"api_key": "k\u00e9y-0123456789"}, "api_key: must contain only ASCII characters"),
    ({"api_key": "a" * 4097}, "api_key: must be at most 4096 characters"),
    ({"template": ""}, "template: must be a non-empty string, not ''"),
    ({"template": "t" * 257}, "template: must be at most 256 characters"),
    ({"template": "a b"}, "template: must not contain whitespace or control characters: 'a b'"),
    ({"domain": 5}, "domain: must be a lowercase hostname such as e2b.app, not int"),
    ({"domain": "BAD"}, "domain: must be a lowercase hostname such as e2b.app, not 'BAD'"),
    ({"timeout_seconds": "1"}, "timeout_seconds: must be an integer number of seconds, not '1'"),
    ({"timeout_seconds": 59}, "timeout_seconds: must be from 60 to 86400, not 59"),
    ({"domain_allowlist": 1}, "domain_allowlist: must be true or false, not 1"),
]  # fmt: skip


@pytest.mark.parametrize("fields, problem", FIELD_PROBLEMS)
def test_refused_field_is_named_with_its_problem(fields: Dict[str, Any], problem: str) -> None:
    kw = {"api_key": KEY, "template": "base", **fields}
    with pytest.raises(ConfigError) as info:
        DeploymentConfig(**kw)
    assert str(info.value) == f"invalid sandbox-e2b deployment config: {problem}"
    assert info.value.problems == (problem,)


def test_bounds_are_inclusive() -> None:
    assert cfg(api_url=URL_2048).api_url == URL_2048
    assert DeploymentConfig("a" * 4096, "base").api_key == "a" * 4096
    assert DeploymentConfig(KEY, "t" * 256).template == "t" * 256


def test_only_urls_lose_trailing_slashes() -> None:
    c = cfg(api_url="http://127.0.0.1:8080/X/", sandbox_url="http://h.example/XX//")
    assert (c.api_url, c.sandbox_url) == ("http://127.0.0.1:8080/X", "http://h.example/XX")
    assert cfg(api_url="http://X/").api_url == "http://X"
    m = DeploymentConfig.from_mapping({"apiKey": KEY, "template": "tpl/"})
    assert m.template == "tpl/"


def test_from_mapping_checks_urls_without_their_trailing_slashes() -> None:
    # 2048 characters once the slashes are gone: accepted, as the constructor does
    slashed = URL_2048 + "//"
    c = DeploymentConfig.from_mapping(
        {"apiKey": KEY, "template": "t", "apiUrl": slashed, "sandboxUrl": slashed}
    )
    assert c.api_url == URL_2048 and c.sandbox_url == URL_2048


def test_from_mapping_null_url_before_other_fields() -> None:
    c = DeploymentConfig.from_mapping({"sandboxUrl": None, "apiKey": KEY, "template": "t"})
    assert c == DeploymentConfig(KEY, "t")


def test_from_mapping_every_key_problem_is_reported() -> None:
    with pytest.raises(ConfigError) as info:
        DeploymentConfig.from_mapping(
            {"apiKey": KEY, "api_key": KEY, "nope": 1, "template": "t", "timeout": 5}
        )
    assert info.value.problems == (
        "apiKey and api_key both given (use one spelling)",
        "unknown key 'nope'",
        "unknown key 'timeout'",
    )


def test_not_a_mapping_and_unknown_fields_messages() -> None:
    with pytest.raises(ConfigError) as info:
        DeploymentConfig.from_mapping([("apiKey", KEY)])  # type: ignore[arg-type]
    assert str(info.value) == (
        "invalid sandbox-e2b deployment config: config must be a mapping, not list"
    )
    assert info.value.problems == ("config must be a mapping, not list",)
    with pytest.raises(ConfigError) as info:
        cfg().replace(nope=1, zz=2)
    assert str(info.value) == (
        "invalid sandbox-e2b deployment config: unknown field 'nope'; unknown field 'zz'"
    )
    assert info.value.problems == ("unknown field 'nope'", "unknown field 'zz'")
    with pytest.raises(ConfigError) as info:
        DeploymentConfig.from_env(
            {"E2B_API_KEY": KEY, "E2B_TEMPLATE": "t", "E2B_TIMEOUT_SECONDS": "1e3"}
        )
    assert info.value.problems == ("E2B_TIMEOUT_SECONDS: must be a decimal integer, not '1e3'",)


def test_api_key_is_a_secret_as_soon_as_it_is_seen() -> None:
    # also when the rest of the config is refused: later messages never show it
    seen = f"e2b_{uuid.uuid4().hex}"
    with pytest.raises(ConfigError):
        DeploymentConfig.from_mapping({"apiKey": seen, "template": ""})
    assert redact(f"key={seen}") == "key=***"
    valid = f"e2b_{uuid.uuid4().hex}"
    DeploymentConfig(valid, "base")
    assert redact(f"key={valid}") == "key=***"


def test_config_schema_properties_in_full() -> None:
    props = config_schema()["properties"]
    assert {k: p["field"] for k, p in props.items()} == {c: s for c, s in zip(CAMEL, SNAKE)}
    assert props["apiUrl"] == {
        "type": "string",
        "format": "uri",
        "pattern": "^https?://",
        "maxLength": 2048,
        "label": {"zh": "接口地址", "en": "API URL"},
        "description": "Control-plane API URL; defaults to https://api.<domain>. "
        "Set it for self-hosted E2B.",
        "field": "api_url",
    }
    s = config_schema()
    assert s["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert s["title"] == "sandbox-e2b deployment config"
