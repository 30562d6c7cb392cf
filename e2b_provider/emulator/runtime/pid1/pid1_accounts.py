"""The sandbox's generated account and name files (pure): ``/etc/passwd``, ``group``,
``shadow``, ``gshadow``, ``hosts``, ``sudoers`` and ``resolv.conf``, and the sandbox's users.
"""

from __future__ import annotations

from typing import List, Sequence, Set, Tuple

__all__ = [
    "RESOLV_CONF",
    "SANDBOX_USERS",
    "render_group",
    "render_gshadow",
    "render_hosts",
    "render_passwd",
    "render_shadow",
    "render_sudoers",
]


# (name, uid/gid, home) of the accounts every sandbox has besides the host's system accounts.
SANDBOX_USERS: Tuple[Tuple[str, int, str], ...] = (
    ("sandbox", 1000, "/home/sandbox"),
    ("user", 1001, "/home/user"),
)


def _system_entry(fields: Sequence[str], reserved: Set[str]) -> bool:
    if len(fields) < 4 or fields[0] in reserved:
        return False
    try:
        ident = int(fields[2])
    except ValueError:
        return False
    return ident < 1000 or ident == 65534


def render_passwd(host_passwd: str) -> str:
    """Return the sandbox's ``/etc/passwd``: the host's system accounts plus the sandbox users.

    Host accounts with uid >= 1000 (real people, CI users) never show inside.

    Args:
        host_passwd: the host's ``/etc/passwd`` text.
    """
    reserved = {name for name, _, _ in SANDBOX_USERS}
    lines = [
        line
        for line in host_passwd.splitlines()
        if line and not line.startswith("#") and _system_entry(line.split(":"), reserved)
    ]
    for name, ident, home in SANDBOX_USERS:
        lines.append(f"{name}:x:{ident}:{ident}:{name}:{home}:/bin/bash")
    return "\n".join(lines) + "\n"


def _names(passwd: str) -> List[str]:
    return [line.split(":", 1)[0] for line in passwd.splitlines() if line]


def render_group(host_group: str, passwd: str) -> str:
    """Return the sandbox's ``/etc/group``: the host's system groups plus the sandbox groups.

    Members that are not accounts of the sandbox are dropped from every group.

    Args:
        host_group: the host's ``/etc/group`` text.
        passwd: the sandbox's ``/etc/passwd`` (from :func:`render_passwd`).
    """
    reserved = {name for name, _, _ in SANDBOX_USERS}
    known = set(_names(passwd))
    lines: List[str] = []
    for line in host_group.splitlines():
        fields = line.split(":")
        if not line or line.startswith("#") or not _system_entry(fields, reserved):
            continue
        members = [m for m in fields[3].split(",") if m and m in known]
        lines.append(":".join([fields[0], fields[1], fields[2], ",".join(members)]))
    for name, ident, _ in SANDBOX_USERS:
        lines.append(f"{name}:x:{ident}:")
    return "\n".join(lines) + "\n"


def render_shadow(passwd: str) -> str:
    """Return a ``/etc/shadow`` with no usable password for any account of ``passwd``."""
    return "".join(f"{name}:*:20000:0:99999:7:::\n" for name in _names(passwd))


def render_gshadow(group: str) -> str:
    """Return a ``/etc/gshadow`` with no group passwords for the groups of ``group``."""
    out = []
    for line in group.splitlines():
        if line:
            fields = line.split(":")
            out.append(f"{fields[0]}:!::{fields[3] if len(fields) > 3 else ''}\n")
    return "".join(out)


def render_hosts(hostname: str) -> str:
    """Return the sandbox's ``/etc/hosts`` (loopback names and the sandbox's hostname)."""
    return (
        "127.0.0.1\tlocalhost\n"
        "::1\tlocalhost ip6-localhost ip6-loopback\n"
        f"127.0.1.1\t{hostname}\n"
    )


def render_sudoers() -> str:
    """Return the sandbox's ``/etc/sudoers``: E2B's base lets ``user`` sudo without a password.

    The host's rules never apply inside (the sandbox gets its own, empty ``/etc/sudoers.d``).
    """
    return (
        "# e2b emulator sandbox: the base template's sudoers\n"
        "Defaults\tenv_reset\n"
        'Defaults\tsecure_path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"\n'
        "root\tALL=(ALL:ALL) ALL\n"
        "%sudo\tALL=(ALL:ALL) ALL\n"
        "user\tALL=(ALL:ALL) NOPASSWD: ALL\n"
        "@includedir /etc/sudoers.d\n"
    )


RESOLV_CONF = (
    "# e2b emulator: sandboxes have no outside network (loopback only).\n"
    "nameserver 127.0.0.1\n"
)
