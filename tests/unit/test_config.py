"""Unit tests of the deployment configuration (e2b_provider.config)."""

from __future__ import annotations

import pickle
from typing import Any, Dict

import attrs
import pytest

from e2b_provider.config import (
    EXTENSION_NAME,
    DeploymentConfig,
    config_schema,
)
from e2b_provider.errors import ConfigError, E2BProviderError, InvalidArgument

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
