"""The emulator's templates: E2B's public ``base`` and the team's snapshot templates.

This module owns what the control plane knows about templates: ``base`` (public, owned by
E2B, so the team may use it but an alias lookup answers 403, as E2B's does) and each snapshot
template the team made with ``POST /sandboxes/{id}/snapshots``: a template id, an optional
alias (in the team's namespace :data:`~.names.TEAM_SLUG`) and one build per tag, each a copy
of the source sandbox's files on disk. It resolves ``[namespace/]alias-or-id[:tag]`` the way
E2B does and renders ``SnapshotInfo``. Pure: it records paths, the server does the file work.
"""

from __future__ import annotations

import time
import uuid
from typing import Dict, List, Optional, Tuple

import attrs

from .errors import BadRequest
from .names import DEFAULT_TAG, TEAM_SLUG, new_template_id, split_namespace, with_tag
from .state import DEFAULT_TEMPLATE, TEMPLATE_SERVICES, TEMPLATE_WITHOUT

__all__ = [
    "BASE",
    "Resolved",
    "SnapshotBuild",
    "SnapshotTemplate",
    "TemplateStore",
]

#: The one public template (E2B's base image; the emulator's sandboxes all boot from it).
BASE = DEFAULT_TEMPLATE


@attrs.define(eq=False)
class SnapshotBuild:
    """One build (tag) of a snapshot template: a copy of a sandbox's files."""

    build_id: str
    tag: str
    files_dir: str
    source_sandbox_id: str
    created_at: float
    memory: bool


@attrs.define(eq=False)
class SnapshotTemplate:
    """A snapshot template of the team: id, optional alias, builds by tag."""

    template_id: str
    alias: Optional[str]
    builds: Dict[str, SnapshotBuild] = attrs.field(factory=dict)

    @property
    def names(self) -> List[str]:
        """Its full names (``local/<alias>``), empty without an alias."""
        return [f"{TEAM_SLUG}/{self.alias}"] if self.alias else []

    def snapshot_id(self, tag: str) -> str:
        """The ``snapshotID`` of its build ``tag`` (name-based when it has an alias)."""
        return with_tag(self.names[0] if self.names else self.template_id, tag)


@attrs.frozen
class Resolved:
    """What a template reference names: ``base``, or a snapshot template and its build."""

    template_id: str
    alias: Optional[str]
    build: Optional[SnapshotBuild]  # None for base
    without: Tuple[str, ...] = ()  # programs the template lacks
    services: Tuple[str, ...] = ()  # services the template runs


class TemplateStore:
    """The snapshot templates of the emulator's team, by id (in memory)."""

    def __init__(self) -> None:
        self.templates: Dict[str, SnapshotTemplate] = {}

    def find(self, identifier: str, *, by_id: bool = True) -> Optional[SnapshotTemplate]:
        """The team's template named ``[local/]alias`` (or with id ``identifier``)."""
        namespace, name = split_namespace(identifier)
        if namespace is not None and namespace != TEAM_SLUG:
            return None
        for tpl in self.templates.values():
            if tpl.alias == name or (by_id and namespace is None and tpl.template_id == name):
                return tpl
        return None

    def is_base(self, identifier: str) -> bool:
        """True for E2B's public ``base`` (``base`` or ``e2b/base``)."""
        return identifier in (BASE, f"e2b/{BASE}")

    def resolve(self, identifier: str, tag: Optional[str]) -> Resolved:
        """The template and build a create request names.

        Raises:
            BadRequest: 404 for an unknown template or tag.
        """
        if identifier.startswith("e2b/") and identifier[4:] in TEMPLATE_SERVICES:
            identifier = identifier[4:]  # E2B's public templates, also by their full name
        if (self.is_base(identifier) or identifier in TEMPLATE_WITHOUT
                or identifier in TEMPLATE_SERVICES):
            if tag is not None:
                raise BadRequest(
                    f"tag '{tag}' does not exist for template '{identifier}'", status=404
                )
            name = BASE if self.is_base(identifier) else identifier
            return Resolved(template_id=name, alias=name, build=None,
                            without=TEMPLATE_WITHOUT.get(name, ()),
                            services=TEMPLATE_SERVICES.get(name, ()))
        tpl = self.find(identifier)
        if tpl is None:
            raise BadRequest(f"template '{identifier}' not found", status=404)
        build = tpl.builds.get(tag or DEFAULT_TAG)
        if build is None:
            raise BadRequest(
                f"tag '{tag or DEFAULT_TAG}' does not exist for template '{identifier}'",
                status=404,
            )
        return Resolved(template_id=tpl.template_id, alias=tpl.alias, build=build)

    def add_build(
        self,
        alias: Optional[str],
        tag: Optional[str],
        *,
        files_dir: str,
        source_sandbox_id: str,
        memory: bool,
    ) -> Tuple[SnapshotTemplate, SnapshotBuild, Optional[SnapshotBuild]]:
        """Record a new build: under the template called ``alias`` (created if new), or of a
        new unnamed template. Returns the template, the build and the build it replaced (same
        tag), whose files the caller removes."""
        tpl = self.find(alias) if alias else None
        if tpl is None:
            tid = new_template_id()
            while tid in self.templates:
                tid = new_template_id()
            tpl = SnapshotTemplate(template_id=tid, alias=alias)
            self.templates[tid] = tpl
        build = SnapshotBuild(
            build_id=str(uuid.uuid4()),
            tag=tag or DEFAULT_TAG,
            files_dir=files_dir,
            source_sandbox_id=source_sandbox_id,
            created_at=time.time(),
            memory=memory,
        )
        old = tpl.builds.get(build.tag)
        tpl.builds[build.tag] = build
        return tpl, build, old

    def remove(self, tpl: SnapshotTemplate) -> List[SnapshotBuild]:
        """Forget a template; returns its builds (the caller removes their files)."""
        self.templates.pop(tpl.template_id, None)
        return list(tpl.builds.values())

    def builds(self) -> List[Tuple[SnapshotTemplate, SnapshotBuild]]:
        """Every (template, build) pair."""
        return [(t, b) for t in self.templates.values() for b in t.builds.values()]
