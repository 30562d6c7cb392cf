"""Template names as E2B's control plane reads them: ``[namespace/]alias[:tag]``.

This module owns the parsing rules of template identifiers (lower-cased and trimmed;
``[a-z0-9-_]`` for the namespace and the alias or template id, ``[a-z0-9-_.]`` for the tag;
the tag ``default`` is the same as none) and the emulator's one team, whose namespace is
:data:`TEAM_SLUG`. Pure: no I/O.
"""

from __future__ import annotations

import re
import secrets
import string
from typing import Optional, Tuple

from .errors import BadRequest

__all__ = [
    "DEFAULT_TAG",
    "TEAM_SLUG",
    "new_template_id",
    "parse_name",
    "split_namespace",
    "with_tag",
]

#: The namespace (team slug) of every template the emulator's one team owns (its snapshots).
TEAM_SLUG = "local"
#: The tag of a build when none is named.
DEFAULT_TAG = "default"

_IDENTIFIER_RE = re.compile(r"^[a-z0-9_-]+$")
_TAG_RE = re.compile(r"^[a-z0-9_.-]+$")
#: The characters of the ids the emulator makes (E2B's: lowercase letters and digits).
ID_ALPHABET = string.ascii_lowercase + string.digits


def _clean(value: str, what: str, pattern: re.Pattern[str]) -> str:
    cleaned = value.strip().lower()
    if not pattern.match(cleaned):
        raise ValueError(f"invalid {what}: {value}")
    return cleaned


def parse_name(raw: str, refusal: str) -> Tuple[str, Optional[str]]:
    """Parse ``[namespace/]alias[:tag]`` into the cleaned identifier and tag.

    Returns:
        ``(identifier, tag)``: the identifier is ``namespace/alias`` or ``alias``; the tag is
        None when absent or ``default``.

    Raises:
        BadRequest: 400 ``<refusal>: …`` for a part with a character outside its alphabet
            (naming it, as E2B does: ``invalid template ID: …``, ``invalid tag: …``,
            ``invalid namespace: …``).
    """
    try:
        return _parse_name(raw)
    except ValueError as exc:
        raise BadRequest(f"{refusal}: {exc}") from None


def _parse_name(raw: str) -> Tuple[str, Optional[str]]:
    text = raw.strip()
    ident_part, sep, tag_part = text.partition(":")
    tag: Optional[str] = None
    if sep:
        cleaned_tag = _clean(tag_part, "tag", _TAG_RE)
        if cleaned_tag != DEFAULT_TAG:
            tag = cleaned_tag
    namespace, slash, alias = ident_part.partition("/")
    if not slash:
        namespace, alias = "", ident_part
    else:
        namespace = _clean(namespace, "namespace", _IDENTIFIER_RE)
    alias = _clean(alias, "template ID", _IDENTIFIER_RE)
    return (f"{namespace}/{alias}" if slash else alias), tag


def split_namespace(identifier: str) -> Tuple[Optional[str], str]:
    """``"ns/alias"`` → ``("ns", "alias")``; ``"alias"`` → ``(None, "alias")``."""
    namespace, slash, alias = identifier.partition("/")
    return (namespace, alias) if slash else (None, identifier)


def with_tag(identifier: str, tag: Optional[str]) -> str:
    """``identifier:tag`` (``default`` when ``tag`` is None)."""
    return f"{identifier}:{tag or DEFAULT_TAG}"


def new_template_id() -> str:
    """A fresh template id: 20 characters of ``[a-z0-9]``."""
    return "".join(secrets.choice(ID_ALPHABET) for _ in range(20))
