"""Deployment configuration of the sandbox-e2b extension: :class:`DeploymentConfig`.

This module owns the settings one deployment gives the provider (API key, template, URLs,
domain, sandbox lifetime, egress switches), their validation, their construction from a
platform mapping (camelCase, as the reference's zod schema) or from ``E2B_*`` environment
variables, and the JSON-schema-like description the platform's extension registry shows
(:func:`config_schema`).

The API key is a secret: it is kept out of ``repr``/``str``, registered with
:func:`~e2b_provider.errors.register_secret` (for the life of the process, as soon as it is
seen, before any other field is checked) so every library error scrubs it, and never quoted
in a validation message, even when the key itself is what is invalid. Pure code: no
I/O, and no requests, urllib3 or socket imports.
"""

from __future__ import annotations

import copy
import os
import re
import unicodedata
import urllib.parse
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import attrs

from . import errors
from .errors import ConfigError, InvalidArgument
from .protocol.e2b_facts import MAX_TIMEOUT_SECONDS
from .protocol.validate import (
    HOSTNAME_RE,
    MAX_HOSTNAME_CHARS,
    UNPRINTABLE_CATEGORIES,
    check_hostname,
    show,
)

__all__ = [
    "DEFAULT_DOMAIN",
    "DEFAULT_TIMEOUT_SECONDS",
    "EXTENSION_NAME",
    "MAX_TIMEOUT_SECONDS",
    "MIN_TIMEOUT_SECONDS",
    "DeploymentConfig",
    "config_schema",
]

#: The extension's name in the platform's registry (as the reference's ``defineExtension``).
EXTENSION_NAME = "sandbox-e2b"
DEFAULT_DOMAIN = "e2b.app"
DEFAULT_TIMEOUT_SECONDS = 3600
MIN_TIMEOUT_SECONDS = 60
MAX_TEMPLATE_CHARS = 256
MAX_API_KEY_CHARS = 4096
MAX_URL_CHARS = 2048

_DIGITS_RE = re.compile(r"[0-9]{1,9}", re.ASCII)

# Field problem checkers: value -> problem text (without the field name) or None.
Checker = Callable[[Any], Optional[str]]


def _bad_char(text: str) -> bool:
    return any(c.isspace() or unicodedata.category(c) in UNPRINTABLE_CATEGORIES for c in text)


def _api_key_problem(value: Any) -> Optional[str]:
    # Never quote the value: it is a secret even when it is malformed.
    if not isinstance(value, str) or value == "" or _bad_char(value):
        return "must be a non-empty string without whitespace or control characters"
    if not value.isascii():
        return "must contain only ASCII characters"
    if len(value) > MAX_API_KEY_CHARS:
        return f"must be at most {MAX_API_KEY_CHARS} characters"
    return None


#: What an E2B API key (``e2b_`` and 40 hex digits), an access token (``sk_e2b_...``) or
#: a bare 40-hex key looks like; no template name or id does (ids are 20 of ``[a-z0-9]``;
#: a name such as ``e2b_code_interpreter`` has more than one word).
_KEY_LIKE_RE = re.compile(r"(?:sk_)?e2b_[0-9a-z]{16,}|[0-9a-f]{40,}", re.ASCII | re.IGNORECASE)


def _template_problem(value: Any) -> Optional[str]:
    if isinstance(value, str) and _KEY_LIKE_RE.fullmatch(value) is not None:
        # api_key and template swapped, most likely: the value is a secret, never quoted.
        errors.register_secret(value)
        return (
            "looks like an E2B API key, not a template name or id (its value is not shown; "
            "were the API key and the template swapped? The order is "
            "DeploymentConfig(api_key, template))"
        )
    if not isinstance(value, str) or value == "":
        return f"must be a non-empty string, not {show(value)}"
    if len(value) > MAX_TEMPLATE_CHARS:
        return f"must be at most {MAX_TEMPLATE_CHARS} characters"
    if _bad_char(value):
        return f"must not contain whitespace or control characters: {show(value)}"
    if any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        return f"must be valid Unicode text (no lone surrogates): {show(value)}"
    return None


def _url_problem(value: Any) -> Optional[str]:
    # URLs are not quoted either: user info or a query string could carry a credential.
    if value is None:
        return None
    if not isinstance(value, str):
        return f"must be an http or https URL string, not {type(value).__name__}"
    if value == "" or len(value) > MAX_URL_CHARS:
        return f"must be an http or https URL of 1-{MAX_URL_CHARS} characters"
    if _bad_char(value) or not value.isascii():
        return "must not contain whitespace, control or non-ASCII characters"
    try:
        parts = urllib.parse.urlsplit(value)
        port = parts.port
    except ValueError:
        return "is not a valid URL (bad host or port)"
    if parts.scheme not in ("http", "https"):
        return "must start with http:// or https://"
    if "@" in parts.netloc:
        return "must not contain user info (user:password@)"
    if not parts.hostname:
        return "must name a host"
    if port == 0:
        return "must not use port 0"
    if parts.query or "?" in value:
        return "must not contain a query string"
    if parts.fragment or "#" in value:
        return "must not contain a fragment"
    return None


def _domain_problem(value: Any) -> Optional[str]:
    if not isinstance(value, str):
        return f"must be a lowercase hostname such as e2b.app, not {type(value).__name__}"
    try:
        check_hostname(value)
    except InvalidArgument:
        return f"must be a lowercase hostname such as e2b.app, not {show(value)}"
    return None


def _timeout_problem(value: Any) -> Optional[str]:
    if not isinstance(value, int) or isinstance(value, bool):
        return f"must be an integer number of seconds, not {show(value)}"
    if not MIN_TIMEOUT_SECONDS <= value <= MAX_TIMEOUT_SECONDS:
        return f"must be from {MIN_TIMEOUT_SECONDS} to {MAX_TIMEOUT_SECONDS}, not {value}"
    return None


def _bool_problem(value: Any) -> Optional[str]:
    if not isinstance(value, bool):
        return f"must be true or false, not {show(value)}"
    return None


def _strip_slashes(value: Any) -> Any:
    """Drop trailing slashes from a URL string (anything else is left for the validator)."""
    if isinstance(value, str) and value.rstrip("/") not in ("http:", "https:"):
        return value.rstrip("/")
    return value


def _validator(checker: Checker) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    def validate(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        problem = checker(value)
        if problem is not None:
            text = f"{attribute.name}: {problem}"
            raise ConfigError(f"invalid {EXTENSION_NAME} deployment config: {text}", [text])

    return validate


def _validate_api_key(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    # The first validator attrs runs: the key is known (and scrubbed from every message)
    # before any other field's validator can quote a value that happens to contain it. API
    # keys are few (one per deployment, not one per sandbox): they stay known for good.
    if isinstance(value, str):
        errors.register_secret(value)
    _validator(_api_key_problem)(inst, attribute, value)


def _meta(camel: str, zh: str, en: str, description: str, **extra: Any) -> Dict[str, Any]:
    return {"camel": camel, "label": {"zh": zh, "en": en}, "description": description, **extra}


#: Each field's checker, used by its validator and by the all-at-once check of
#: :meth:`DeploymentConfig.from_mapping` and :meth:`DeploymentConfig.from_env`.
_CHECKS: Dict[str, Checker] = {
    "api_key": _api_key_problem,
    "template": _template_problem,
    "api_url": _url_problem,
    "domain": _domain_problem,
    "timeout_seconds": _timeout_problem,
    "domain_allowlist": _bool_problem,
    "allow_open_egress": _bool_problem,
    "sandbox_url": _url_problem,
}

#: What the platform's extension registry shows of each field (its camelCase key, labels and
#: description: see :func:`config_schema`), kept as the field's metadata.
_TEXTS: Dict[str, Dict[str, Any]] = {
    "api_key": _meta("apiKey", "API 密钥", "API key", "The E2B API key (e2b_...).", secret=True),
    "template": _meta(
        "template", "模板", "Template",
        "Template name or id, built from the platform's sandbox Dockerfile.",
    ),
    "api_url": _meta(
        "apiUrl", "接口地址", "API URL",
        "Control-plane API URL; defaults to https://api.<domain>. Set it for self-hosted E2B.",
    ),
    "domain": _meta(
        "domain", "沙箱域名", "Sandbox domain",
        "Sandbox domain (envd at https://49983-<sandbox id>.<domain>); a domain returned "
        "by the API wins.",
    ),
    "timeout_seconds": _meta(
        "timeoutSeconds", "沙箱超时", "Sandbox timeout",
        "Sandbox lifetime in seconds: at the end E2B pauses the sandbox (files are kept). "
        "Each use pushes it forward; long commands push it by their timeout plus a margin.",
    ),
    "domain_allowlist": _meta(
        "domainAllowlist", "按域名出站白名单", "Domain egress allowlist",
        "Whether the E2B deployment supports per-domain egress allowlists (E2B cloud "
        "does). When false, egress 'allowlist' degrades to 'none' with a warning.",
    ),
    "allow_open_egress": _meta(
        "allowOpenEgress", "允许开放出站", "Allow open egress",
        "Allow sandbox egress 'open' (default false: create refuses it).",
    ),
    "sandbox_url": _meta(
        "sandboxUrl", "沙箱地址", "Sandbox URL",
        "One base URL for all envd traffic, routed by the E2b-Sandbox-Id header "
        "(like the SDK's E2B_SANDBOX_URL); unset: https://49983-<id>.<domain>.",
    ),
}


def _checked(name: str) -> Dict[str, Any]:
    """The ``validator`` and ``metadata`` of field ``name``: its checker and its texts."""
    return {"validator": _validator(_CHECKS[name]), "metadata": _TEXTS[name]}


@attrs.frozen(repr=False)
class DeploymentConfig:
    """Settings of one E2B deployment (the reference's ``DeploymentConfig`` zod schema).

    Construct it directly (``DeploymentConfig("e2b_...", "my-template", domain="e2b.app")``),
    from a platform mapping with :meth:`from_mapping`, or from ``E2B_*`` variables with
    :meth:`from_env`. Every construction validates and raises
    :class:`~e2b_provider.errors.ConfigError` (a ``ValueError``) on a bad field.

    Attributes:
        api_key: the E2B API key (``e2b_...``). Secret: never in ``repr``, ``str`` or errors.
        template: the template name or id the sandboxes are created from.
        api_url: the control-plane URL (http/https, no user info, query or fragment);
            None means ``https://api.<domain>`` (see :attr:`effective_api_url`). Set it for
            self-hosted E2B. Trailing slashes are dropped.
        domain: the sandbox domain; envd lives at ``https://49983-<id>.<domain>`` (a domain
            returned by the API wins).
        timeout_seconds: sandbox lifetime, 60 to 86400 (default 3600). At the end E2B
            pauses the sandbox and keeps its files; each use pushes it forward.
        domain_allowlist: whether the deployment supports per-domain egress allowlists
            (E2B cloud does); when False, ``allowlist`` degrades to ``none`` with a warning.
        allow_open_egress: when False (default), ``create`` refuses ``egress="open"``.
        sandbox_url: one base URL for all envd traffic, routed by the ``E2b-Sandbox-Id``
            header (as the official SDK's ``E2B_SANDBOX_URL``); None for per-sandbox hosts.
    """

    api_key: str = attrs.field(repr=False, validator=_validate_api_key, metadata=_TEXTS["api_key"])
    template: str = attrs.field(**_checked("template"))
    api_url: Optional[str] = attrs.field(
        default=None, kw_only=True, converter=_strip_slashes, **_checked("api_url")
    )
    domain: str = attrs.field(default=DEFAULT_DOMAIN, kw_only=True, **_checked("domain"))
    timeout_seconds: int = attrs.field(
        default=DEFAULT_TIMEOUT_SECONDS, kw_only=True, **_checked("timeout_seconds")
    )
    domain_allowlist: bool = attrs.field(default=True, kw_only=True, **_checked("domain_allowlist"))
    allow_open_egress: bool = attrs.field(
        default=False, kw_only=True, **_checked("allow_open_egress")
    )
    sandbox_url: Optional[str] = attrs.field(
        default=None, kw_only=True, converter=_strip_slashes, **_checked("sandbox_url")
    )

    @property
    def effective_api_url(self) -> str:
        """The control-plane base URL: :attr:`api_url`, or ``https://api.<domain>``."""
        return self.api_url if self.api_url is not None else f"https://api.{self.domain}"

    def __repr__(self) -> str:
        fields = ", ".join(
            "api_key='***'" if a.name == "api_key" else f"{a.name}={getattr(self, a.name)!r}"
            for a in attrs.fields(DeploymentConfig)
        )
        return f"DeploymentConfig({fields})"

    __str__ = __repr__

    def replace(self, **changes: Any) -> DeploymentConfig:
        """A copy with ``changes`` (snake_case field names) applied and validated.

        Raises:
            ConfigError: an unknown field name, or an invalid value.
        """
        unknown = sorted(k for k in changes if k not in _FIELDS)
        if unknown:
            problems = [f"unknown field {show(k)}" for k in unknown]
            raise ConfigError(_summary(problems), problems)
        return attrs.evolve(self, **changes)

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> DeploymentConfig:
        """Build a config from a platform mapping, checking everything at once.

        Accepts the reference's camelCase keys (``apiKey``, ``apiUrl``, ``domain``,
        ``template``, ``timeoutSeconds``, ``domainAllowlist``, ``allowOpenEgress``,
        ``sandboxUrl``) and their snake_case spellings. Types are strict: no ``"3600"`` for an
        int and no ``1`` for a bool. ``None`` counts as unset for ``apiUrl``/``sandboxUrl``.

        Raises:
            ConfigError: listing, in ``.problems``, every unknown or duplicated key, missing
                required field and invalid value (never quoting the API key).
        """
        if not isinstance(mapping, Mapping):
            problem = f"config must be a mapping, not {type(mapping).__name__}"
            raise ConfigError(_summary([problem]), [problem])
        items, problems = _normalize_keys(mapping.items())
        return cls._build(items, problems, {})

    @classmethod
    def from_env(
        cls, environ: Optional[Mapping[str, str]] = None, **overrides: Any
    ) -> DeploymentConfig:
        """Build a config from ``E2B_*`` environment variables, then ``overrides``.

        Reads ``E2B_API_KEY``, ``E2B_API_URL``, ``E2B_DOMAIN``, ``E2B_SANDBOX_URL``,
        ``E2B_TEMPLATE`` and ``E2B_TIMEOUT_SECONDS`` (a decimal integer); empty strings count
        as unset. Keyword ``overrides`` (snake_case or camelCase) win over the environment.

        Args:
            environ: the environment to read; ``os.environ`` when None.
            **overrides: field values that take precedence.

        Raises:
            ConfigError: listing every problem, as :meth:`from_mapping`.
        """
        env = os.environ if environ is None else environ
        items: Dict[str, Tuple[str, Any]] = {}
        problems: List[str] = []
        for var, name in _ENV_VARS:
            raw = env.get(var)
            if raw is None or raw == "":
                continue
            value: Any = raw
            if name == "timeout_seconds":
                text = raw.strip()
                if _DIGITS_RE.fullmatch(text) is None:
                    problems.append(f"{var}: must be a decimal integer, not {show(raw)}")
                    continue
                value = int(text)
            items[name] = (var, value)
        given, key_problems = _normalize_keys(overrides.items())
        problems.extend(key_problems)
        items.update(given)
        hints = {name: f" (set {var})" for var, name in _ENV_VARS}
        return cls._build(items, problems, hints)

    @classmethod
    def _build(
        cls,
        items: Dict[str, Tuple[str, Any]],
        problems: List[str],
        hints: Dict[str, str],
    ) -> DeploymentConfig:
        """Check every field of ``items`` (name -> (label, value)), then construct."""
        api_key = items.get("api_key", ("", None))[1]
        if isinstance(api_key, str):
            errors.register_secret(api_key)  # for good: also if the config is refused
        for name in ("api_key", "template"):
            if name not in items:
                problems.append(f"{_CAMEL[name]}: required{hints.get(name, '')}")
        kwargs: Dict[str, Any] = {}
        for name, (label, value) in items.items():
            if value is None and name in ("api_url", "sandbox_url"):
                continue
            value = _strip_slashes(value) if name in ("api_url", "sandbox_url") else value
            problem = _CHECKS[name](value)
            if problem is not None:
                problems.append(f"{label}: {problem}")
            kwargs[name] = value
        if problems:
            raise ConfigError(_summary(problems), problems)
        return cls(**kwargs)


def _summary(problems: List[str]) -> str:
    return f"invalid {EXTENSION_NAME} deployment config: " + "; ".join(problems)


_FIELDS: Tuple[str, ...] = tuple(a.name for a in attrs.fields(DeploymentConfig))
_CAMEL: Dict[str, str] = {a.name: a.metadata["camel"] for a in attrs.fields(DeploymentConfig)}
_ALIASES: Dict[str, str] = {**{c: n for n, c in _CAMEL.items()}, **{n: n for n in _FIELDS}}
_ENV_VARS: Tuple[Tuple[str, str], ...] = (
    ("E2B_API_KEY", "api_key"),
    ("E2B_API_URL", "api_url"),
    ("E2B_DOMAIN", "domain"),
    ("E2B_SANDBOX_URL", "sandbox_url"),
    ("E2B_TEMPLATE", "template"),
    ("E2B_TIMEOUT_SECONDS", "timeout_seconds"),
)


def _normalize_keys(
    pairs: Any,
) -> Tuple[Dict[str, Tuple[str, Any]], List[str]]:
    """Map given keys to field names: (name -> (spelling, value)), problems."""
    items: Dict[str, Tuple[str, Any]] = {}
    problems: List[str] = []
    for key, value in pairs:
        name = _ALIASES.get(key) if isinstance(key, str) else None
        if name is None:
            problems.append(f"unknown key {show(key)}")
            continue
        if name in items:
            problems.append(f"{items[name][0]} and {key} both given (use one spelling)")
            continue
        items[name] = (key, value)
    return items, problems


def _url_schema() -> Dict[str, Any]:
    return {"type": "string", "format": "uri", "pattern": "^https?://", "maxLength": MAX_URL_CHARS}


_SCHEMA_TYPES: Dict[str, Dict[str, Any]] = {
    "api_key": {"type": "string", "minLength": 1, "maxLength": MAX_API_KEY_CHARS},
    "template": {"type": "string", "minLength": 1, "maxLength": MAX_TEMPLATE_CHARS},
    "api_url": _url_schema(),
    "domain": {
        "type": "string",
        "pattern": f"^{HOSTNAME_RE.pattern}$",
        "maxLength": MAX_HOSTNAME_CHARS,
    },
    "timeout_seconds": {
        "type": "integer",
        "minimum": MIN_TIMEOUT_SECONDS,
        "maximum": MAX_TIMEOUT_SECONDS,
    },
    "domain_allowlist": {"type": "boolean"},
    "allow_open_egress": {"type": "boolean"},
    "sandbox_url": _url_schema(),
}


def config_schema() -> Dict[str, Any]:
    """A JSON-schema-like description of :class:`DeploymentConfig`, keyed by camelCase name.

    Each property has its JSON type and bounds, ``default`` when it has one, ``label``
    (``{"zh": ..., "en": ...}``), ``description``, the snake_case ``field`` name, and
    ``secret: true`` for ``apiKey``. A fresh copy is returned on each call.
    """
    properties: Dict[str, Any] = {}
    for a in attrs.fields(DeploymentConfig):
        prop = copy.deepcopy(_SCHEMA_TYPES[a.name])
        if a.default is not attrs.NOTHING and a.default is not None:
            prop["default"] = a.default
        prop["label"] = dict(a.metadata["label"])
        prop["description"] = a.metadata["description"]
        prop["field"] = a.name
        if a.metadata.get("secret"):
            prop["secret"] = True
        properties[a.metadata["camel"]] = prop
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"{EXTENSION_NAME} deployment config",
        "type": "object",
        "properties": properties,
        "required": ["apiKey", "template"],
        "additionalProperties": False,
    }
