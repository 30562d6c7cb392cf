"""Sandbox network settings: validated as E2B validates them, recorded, and reported back.

This module owns the ``network`` object of a create body (``SandboxNetworkConfig``) and the
body of ``PUT /sandboxes/{id}/network`` (``SandboxNetworkUpdateConfig``, which replaces every
egress setting: an omitted field is cleared). Checks follow E2B's: ``denyOut`` holds IPs or
CIDRs only (no unspecified address but ``0.0.0.0/0``); ``allowOut`` IPs, CIDRs or domains, and
domains only together with a ``denyOut`` of ``0.0.0.0/0``; per-domain header rules (at most 10
domains, one rule each, 20 headers of valid names and values); an egress proxy ``host:port``
(its password and CA certificate are never reported back); IPv4 DNS servers; HTTPS ports.

In the emulator every sandbox has loopback only, so these settings are recorded, reported by
``GET /sandboxes/{id}`` and mapped to the runtime's egress mode, but never open anything.
``allowPublicTraffic: false`` gives the sandbox a traffic access token. Pure: no I/O.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

import attrs

from ...protocol.e2b_facts import ENVD_PORT
from .errors import BadRequest

__all__ = [
    "ALL_TRAFFIC",
    "NetworkConfig",
    "egress_mode",
    "parse_network_config",
    "parse_network_update",
]

#: The CIDR that means "all traffic".
ALL_TRAFFIC = "0.0.0.0/0"
_DOMAINS_NEED_BLOCK_ALL = (
    "When specifying allowed domains in allow out, you must include 'ALL_TRAFFIC' in deny out "
    "to block all other traffic."
)
_MAX_RULE_DOMAINS = 10
_MAX_RULES_PER_DOMAIN = 1
_MAX_DOMAIN_LEN = 128
_MAX_HEADERS = 20
_MAX_HEADER_NAME = 64
_MAX_HEADER_VALUE = 2048
_MAX_DNS_SERVERS = 10
_TOKEN_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_LABEL_RE = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$")


def _ip_or_cidr(entry: str) -> Optional[str]:
    """The IP written in ``entry`` when it is an IP or a CIDR, else None."""
    try:
        return str(ipaddress.ip_address(entry))
    except ValueError:
        pass
    if "/" not in entry:
        return None
    try:
        return str(ipaddress.ip_interface(entry).ip)
    except ValueError:
        return None


def _specified_ip_or_cidr(entry: str) -> bool:
    ip = _ip_or_cidr(entry)
    if ip is None:
        return False
    return entry == ALL_TRAFFIC or not ipaddress.ip_address(ip).is_unspecified


def _dns_name(name: str) -> bool:
    host = name[2:] if name.startswith("*.") else name
    host = host[:-1] if host.endswith(".") else host
    return bool(host) and len(host) <= 253 and all(_LABEL_RE.match(p) for p in host.split("."))


def _str_list(body: Mapping[str, Any], key: str, where: str) -> Optional[List[str]]:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest(f"validation error: field '{where}{key}' must be a list of strings")
    return list(value)


def _check_egress(allow_out: List[str], deny_out: List[str]) -> None:
    for cidr in deny_out:
        if not _specified_ip_or_cidr(cidr):
            raise BadRequest(f"invalid denied CIDR {cidr}")
    domains = False
    for entry in allow_out:
        if _ip_or_cidr(entry) is None:
            domains = True
        elif not _specified_ip_or_cidr(entry):
            raise BadRequest(f"invalid allowed address {entry}")
    if domains and ALL_TRAFFIC not in deny_out:
        raise BadRequest(_DOMAINS_NEED_BLOCK_ALL)


def _check_rules(value: Any, where: str) -> Optional[Dict[str, List[Dict[str, Any]]]]:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadRequest(f"validation error: field '{where}rules' must be an object")
    if len(value) > _MAX_RULE_DOMAINS:
        raise BadRequest(f"Network rules can have at most {_MAX_RULE_DOMAINS} domains.")
    out: Dict[str, List[Dict[str, Any]]] = {}
    for domain, rules in value.items():
        if not domain:
            raise BadRequest("Rule domain must not be empty.")
        if len(domain) > _MAX_DOMAIN_LEN:
            raise BadRequest(
                f"Rule domain {domain!r} exceeds maximum length of {_MAX_DOMAIN_LEN} characters."
            )
        if not _dns_name(domain):
            raise BadRequest(f'Rule domain "{domain}" is not a valid domain name.')
        if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
            raise BadRequest(f"validation error: field '{where}rules.{domain}' must be a list")
        if len(rules) > _MAX_RULES_PER_DOMAIN:
            raise BadRequest(
                f'Domain "{domain}" can have at most {_MAX_RULES_PER_DOMAIN} transform rule.'
            )
        out[domain] = [_check_rule(domain, rule) for rule in rules]
    return out


def _check_rule(domain: str, rule: Mapping[str, Any]) -> Dict[str, Any]:
    transform = rule.get("transform")
    if transform is None:
        return {}
    headers = transform.get("headers") if isinstance(transform, dict) else None
    if not isinstance(transform, dict) or (
        headers is not None
        and (
            not isinstance(headers, dict)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
        )
    ):
        raise BadRequest("validation error: a rule's transform.headers must map strings")
    if headers is None:
        return {"transform": {}}
    if len(headers) > _MAX_HEADERS:
        raise BadRequest(f'Domain "{domain}" can have at most {_MAX_HEADERS} headers per rule.')
    for name, val in headers.items():
        if not name:
            raise BadRequest(f'Header name in rule for domain "{domain}" must not be empty.')
        if not _TOKEN_RE.match(name):
            raise BadRequest(
                f'Header name "{name}" in rule for domain "{domain}" must contain only valid '
                "HTTP token characters."
            )
        if len(name) > _MAX_HEADER_NAME:
            raise BadRequest(
                f'Header name "{name}" in rule for domain "{domain}" exceeds maximum length of '
                f"{_MAX_HEADER_NAME} characters."
            )
        if any((ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F for c in val):
            raise BadRequest(
                f'Value for header "{name}" in rule for domain "{domain}" contains invalid '
                "characters."
            )
        if len(val) > _MAX_HEADER_VALUE:
            raise BadRequest(
                f'Value for header "{name}" in rule for domain "{domain}" exceeds maximum '
                f"length of {_MAX_HEADER_VALUE} characters."
            )
    return {"transform": {"headers": dict(headers)}}


def _check_proxy(value: Any, where: str) -> Optional[Dict[str, Any]]:
    """Validate an egress proxy; return what may be reported back (no password, no CA)."""
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("address"), str):
        raise BadRequest(f"validation error: field '{where}egressProxy.address' is required")
    address = value["address"]
    host, sep, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise BadRequest(f"Invalid egress proxy config: address {address!r} must be host:port")
    shown: Dict[str, Any] = {"address": address}
    for key in ("username", "password"):
        item = value.get(key)
        if item is None:
            continue
        if not isinstance(item, str) or len(item.encode()) > 255:
            raise BadRequest(f"Invalid egress proxy config: {key} must be at most 255 bytes")
        if key == "username":
            shown[key] = item
    if value.get("password") is not None and value.get("username") is None:
        raise BadRequest("Invalid egress proxy config: password needs a username")
    tls = value.get("tls")
    if tls is not None:
        if not isinstance(tls, dict) or not isinstance(tls.get("enabled"), bool):
            field = f"{where}egressProxy.tls.enabled"
            raise BadRequest(f"validation error: field '{field}' is required")
        if tls["enabled"]:
            shown_tls: Dict[str, Any] = {"enabled": True}
            if isinstance(tls.get("serverName"), str):
                shown_tls["serverName"] = tls["serverName"]
            shown["tls"] = shown_tls
    return shown


def _check_dns(value: Optional[List[str]]) -> Optional[List[str]]:
    if value is None:
        return None
    if len(value) > _MAX_DNS_SERVERS:
        raise BadRequest(f"at most {_MAX_DNS_SERVERS} DNS servers can be allowed")
    for server in value:
        try:
            ipaddress.IPv4Address(server)
        except ValueError:
            raise BadRequest(f"invalid DNS server {server}: must be an IPv4 address") from None
    return value


@attrs.frozen
class NetworkConfig:
    """A sandbox's recorded network settings (E2B's field names, reportable values only).

    Attributes:
        allow_out / deny_out: the egress lists, None when not set.
        dns_servers: the allowed DNS servers, None for the default.
        rules: per-domain transform rules, None when not set.
        egress_proxy: the proxy as reported (no password, no CA certificate).
        allow_public_traffic: False when sandbox URLs need the traffic access token.
        mask_request_host / https_ports: recorded ingress settings.
    """

    allow_out: Optional[Tuple[str, ...]] = None
    deny_out: Optional[Tuple[str, ...]] = None
    dns_servers: Optional[Tuple[str, ...]] = None
    rules: Optional[Mapping[str, Any]] = None
    egress_proxy: Optional[Mapping[str, Any]] = None
    allow_public_traffic: Optional[bool] = None
    mask_request_host: Optional[str] = None
    https_ports: Optional[Tuple[int, ...]] = None

    def to_json(self) -> Dict[str, Any]:
        """The ``network`` object of ``GET /sandboxes/{id}`` (unset fields left out)."""
        out: Dict[str, Any] = {}
        for key, value in (
            ("allowPublicTraffic", self.allow_public_traffic),
            ("allowOut", self.allow_out),
            ("denyOut", self.deny_out),
            ("dnsServers", self.dns_servers),
            ("egressProxy", self.egress_proxy),
            ("maskRequestHost", self.mask_request_host),
            ("httpsPorts", self.https_ports),
            ("rules", self.rules),
        ):
            if value is None:
                continue
            out[key] = list(value) if isinstance(value, tuple) else value
        return out


def _egress_fields(body: Mapping[str, Any], where: str) -> Dict[str, Any]:
    allow_out = _str_list(body, "allowOut", where)
    deny_out = _str_list(body, "denyOut", where)
    _check_egress(allow_out or [], deny_out or [])
    return {
        "allow_out": tuple(allow_out) if allow_out is not None else None,
        "deny_out": tuple(deny_out) if deny_out is not None else None,
        "dns_servers": _tuple(_check_dns(_str_list(body, "dnsServers", where))),
        "rules": _check_rules(body.get("rules"), where),
        "egress_proxy": _check_proxy(body.get("egressProxy"), where),
    }


def _tuple(value: Optional[List[str]]) -> Optional[Tuple[str, ...]]:
    return tuple(value) if value is not None else None


def parse_network_config(value: Any) -> Optional[NetworkConfig]:
    """Validate the ``network`` object of a create body (None when absent).

    Raises:
        BadRequest: wrongly typed fields or rules E2B refuses (see the module docstring).
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadRequest("validation error: field 'network' must be an object")
    fields = _egress_fields(value, "network.")
    public = value.get("allowPublicTraffic")
    if public is not None and not isinstance(public, bool):
        raise BadRequest("validation error: field 'network.allowPublicTraffic' must be a boolean")
    mask = value.get("maskRequestHost")
    if mask is not None and (not isinstance(mask, str) or not mask.isascii() or not mask):
        raise BadRequest(f"mask request host is not valid: {mask}")
    ports = value.get("httpsPorts")
    if ports is not None:
        if not isinstance(ports, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and 1 <= p <= 65535 for p in ports
        ):
            raise BadRequest("validation error: field 'network.httpsPorts' must list ports")
        if ENVD_PORT in ports:
            raise BadRequest(f"httpsPorts cannot include the envd port {ENVD_PORT}")
        ports = tuple(ports)
    return NetworkConfig(
        allow_public_traffic=public, mask_request_host=mask, https_ports=ports, **fields
    )


def parse_network_update(
    body: Mapping[str, Any], current: Optional[NetworkConfig]
) -> Tuple[NetworkConfig, Optional[bool]]:
    """Validate a ``PUT /sandboxes/{id}/network`` body against the sandbox's settings.

    Returns:
        The new settings (every egress field replaced, omitted ones cleared; the ingress
        settings kept) and the new ``allow_internet_access`` (None: unchanged).

    Raises:
        BadRequest: wrongly typed fields or rules E2B refuses.
    """
    fields = _egress_fields(body, "")
    allow_internet = body.get("allow_internet_access")
    if allow_internet is not None and not isinstance(allow_internet, bool):
        raise BadRequest("validation error: field 'allow_internet_access' must be a boolean")
    base = current if current is not None else NetworkConfig()
    return attrs.evolve(base, **fields), allow_internet


def egress_mode(
    network: Optional[NetworkConfig], allow_internet_access: Optional[bool]
) -> Tuple[str, Tuple[str, ...]]:
    """The runtime's egress mode for these settings: ``allowlist`` of ``allowOut``;
    ``none`` for ``allow_internet_access: false`` or a ``denyOut`` of all traffic; else
    ``open``. Recorded only: sandboxes have loopback alone whatever the mode."""
    allow = tuple(network.allow_out or ()) if network is not None else ()
    deny = tuple(network.deny_out or ()) if network is not None else ()
    if allow:
        return "allowlist", allow
    if allow_internet_access is False or ALL_TRAFFIC in deny:
        return "none", ()
    return "open", ()
