"""The team's volumes: where they are kept, and E2B's control-plane routes for them.

This module owns :class:`VolumeStore` (the team's volumes under
``<state dir>/volumes/<team>/<volume id>/``: ``volume.json`` with the name, ``data/`` with the
files; reloaded when the emulator starts on the same state dir; the team is the API key, named
by a hash of it) and :class:`VolumeRoutes`, the handlers of ``POST /volumes`` (names of
``[A-Za-z0-9_-]``, 400 for a taken one, as E2B answers), ``GET /volumes``,
``GET /volumes/{id}`` (with the content token) and ``DELETE /volumes/{id}``, and the check of a
create body's ``volumeMounts`` against the team's volumes (E2B's messages).

A volume's content token is an HMAC of its id under the API key: a bearer token for the volume
content API (:mod:`.volume_content`), valid for that volume only, never expiring. Destroying a
volume that sandboxes mount answers 204 at once (as E2B) and removes it from every answer; its
files stay until the last sandbox mounting it is killed, so no running or paused sandbox loses
the directory under its mount.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import threading
import time
import uuid
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import attrs
from aiohttp import web

from .errors import BadRequest
from .lifecycle import SandboxLifecycle
from .routing import Router, json_body
from .state import VolumeMount
from .volume_files import IdMap, VolumeRoot

__all__ = ["VolumeRecord", "VolumeRoutes", "VolumeStore"]

_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]+$")
_INFO = "volume.json"
_DATA = "data"
_GONE = "destroyed"
#: Where the sandbox's kernel filesystems and envd's socket live: no volume mounts there.
_RESERVED = ("/proc", "/sys", "/dev", "/run")


@attrs.frozen
class VolumeRecord:
    """One volume of the team: id, name, its directory (``data`` under it holds the files)."""

    volume_id: str
    name: str
    directory: str
    created_at: float

    @property
    def data_dir(self) -> str:
        """The host directory of the volume's files (what sandboxes mount)."""
        return os.path.join(self.directory, _DATA)


def parse_volume_id(raw: str) -> str:
    """The canonical form of a volume id from a path (a UUID).

    Raises:
        BadRequest: 400 ``Invalid volume ID``.
    """
    try:
        return str(uuid.UUID(raw))
    except ValueError:
        raise BadRequest("Invalid volume ID") from None


class VolumeStore:
    """The team's volumes on disk and in memory.

    Args:
        root: the team's volume directory (created if missing, mode 0700).
        api_key: the team's key: content tokens are derived from it.
        ids: the sandboxes' ids against the host's (owner of a new volume's root).
    """

    def __init__(self, root: str, api_key: str, ids: IdMap) -> None:
        self.root = root
        self.ids = ids
        self._key = hashlib.sha256(b"e2b-emulator volume token\0" + api_key.encode()).digest()
        self._volumes: Dict[str, VolumeRecord] = {}
        #: destroyed volumes whose files wait for the last sandbox mounting them
        self._retired: Dict[str, str] = {}
        self._creating = threading.Lock()  # create runs in executor threads: one at a time

    def load(self) -> List[str]:
        """Read the volumes kept under :attr:`root`; returns the directories of destroyed
        volumes left behind (to be removed)."""
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        leftovers = []
        for entry in sorted(os.listdir(self.root)):
            directory = os.path.join(self.root, entry)
            try:
                with open(os.path.join(directory, _INFO), encoding="utf-8") as f:
                    info = json.load(f)
                rec = VolumeRecord(
                    volume_id=str(uuid.UUID(entry)),
                    name=str(info["name"]),
                    directory=directory,
                    created_at=float(info.get("createdAt", 0.0)),
                )
            except (OSError, ValueError, KeyError, TypeError):
                if os.path.isdir(directory) and not os.path.islink(directory):
                    leftovers.append(directory)
                continue
            self._volumes[rec.volume_id] = rec
        return leftovers

    def token(self, rec: VolumeRecord) -> str:
        """The volume's content token."""
        return hmac.new(self._key, rec.volume_id.encode(), hashlib.sha256).hexdigest()

    def check_token(self, volume_id: str, token: Optional[str]) -> Optional[VolumeRecord]:
        """The volume when ``token`` is its content token, else None."""
        rec = self._volumes.get(volume_id)
        if rec is None or token is None:
            return None
        given = token.encode("utf-8", "surrogateescape")
        return rec if hmac.compare_digest(given, self.token(rec).encode()) else None

    def all(self) -> List[VolumeRecord]:
        """Every volume, oldest first."""
        return sorted(self._volumes.values(), key=lambda r: (r.created_at, r.name))

    def get(self, volume_id: str) -> VolumeRecord:
        """The volume with this id.

        Raises:
            BadRequest: 404 ``Volume not found``.
        """
        rec = self._volumes.get(volume_id)
        if rec is None:
            raise BadRequest("Volume not found", status=404)
        return rec

    def by_name(self) -> Dict[str, VolumeRecord]:
        """The volumes by name."""
        return {r.name: r for r in self._volumes.values()}

    def create(self, name: str) -> VolumeRecord:
        """Create an empty volume (blocking: a directory and a small file).

        Raises:
            BadRequest: 400 for an invalid or taken name.
        """
        if not _NAME_RE.match(name):
            raise BadRequest("Invalid volume name")
        with self._creating:
            return self._create(name)

    def _create(self, name: str) -> VolumeRecord:
        if name in self.by_name():
            raise BadRequest(f"Volume with name '{name}' already exists")
        volume_id = str(uuid.uuid4())
        directory = os.path.join(self.root, volume_id)
        rec = VolumeRecord(
            volume_id=volume_id, name=name, directory=directory, created_at=time.time()
        )
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        os.mkdir(directory, 0o700)
        data = rec.data_dir
        os.mkdir(data, 0o700)
        host_uid, host_gid = self.ids.outside(0, 0)
        if self.ids.can_chown and host_uid is not None and host_gid is not None:
            os.chown(data, host_uid, host_gid)  # the sandbox's root owns the volume's root
        os.chmod(data, 0o777)
        info = os.path.join(directory, _INFO)
        with open(info + ".new", "w", encoding="utf-8") as f:
            json.dump({"volumeID": volume_id, "name": name, "createdAt": rec.created_at}, f)
        os.replace(info + ".new", info)
        self._volumes[volume_id] = rec
        return rec

    def destroy(self, rec: VolumeRecord, mounted: bool) -> Optional[str]:
        """Forget a volume. Returns its directory to remove now, or None when sandboxes
        mount it (then :meth:`release` hands it over once none does)."""
        del self._volumes[rec.volume_id]
        try:
            os.replace(os.path.join(rec.directory, _INFO), os.path.join(rec.directory, _GONE))
        except OSError:
            pass
        if mounted:
            self._retired[rec.volume_id] = rec.directory
            return None
        return rec.directory

    def release(self, mounted: Set[str]) -> List[str]:
        """The directories of destroyed volumes no sandbox in ``mounted`` (volume ids) uses."""
        done = [vid for vid in self._retired if vid not in mounted]
        return [self._retired.pop(vid) for vid in done]

    def content_root(self, rec: VolumeRecord) -> VolumeRoot:
        """Safe access to the volume's files."""
        return VolumeRoot(rec.data_dir, self.ids)

    def resolve_mounts(self, mounts: Sequence[VolumeMount]) -> Tuple[VolumeMount, ...]:
        """Check a create body's ``volumeMounts`` against the team's volumes (E2B's order and
        messages) and fill in each volume's id.

        Raises:
            BadRequest: 400 ``invalid mounts:`` listing every bad mount.
        """
        names = self.by_name()
        problems: List[str] = []
        used: Set[str] = set()
        out: List[VolumeMount] = []
        for index, mount in enumerate(mounts):
            rec = names.get(mount.name)
            reason: Optional[str] = None
            if rec is None:
                reason = f"volume '{mount.name}' not found"
            else:
                reason = _mount_path_problem(mount.path)
                if reason is None and mount.path in used:
                    reason = f"path '{mount.path}' is already used"
            if reason is not None:
                problems.append(f"\t- volume mount #{index}: {reason}")
                continue
            assert rec is not None
            used.add(mount.path)
            out.append(attrs.evolve(mount, volume_id=rec.volume_id))
        if problems:
            raise BadRequest("invalid mounts:\n" + "\n".join(problems))
        return tuple(out)


def _mount_path_problem(path: str) -> Optional[str]:
    """Why ``path`` cannot be a mount point (E2B's rules, and not ``/``), or None."""
    if not path:
        return "path cannot be empty"
    if not path.startswith("/"):
        return "path must be absolute"
    if os.path.normpath(path) != path or path.startswith("//"):
        return "path must not contain any '.' or '..' components"
    if path == "/":
        return "path cannot be the sandbox's root"
    if any(path == d or path.startswith(d + "/") for d in _RESERVED):
        return f"path '{path}' is inside a directory the sandbox's system mounts there"
    if "\0" in path:
        return "path must not contain NUL"
    return None


def mounted_volume_ids(records: Iterable[Any]) -> Set[str]:
    """The ids of the volumes the given sandbox records mount."""
    return {m.volume_id for rec in records for m in rec.volume_mounts}


class VolumeRoutes:
    """The control-plane volume handlers of one emulator server.

    Args:
        server: the server's sandbox table (to know which volumes are mounted) and loop.
        store: the team's volumes.
    """

    def __init__(self, server: SandboxLifecycle, store: VolumeStore) -> None:
        self._server = server
        self._store = store

    def add_routes(self, app: web.Application, route: Router) -> None:
        """Register the routes on ``app``, each wrapped by ``route``."""
        r = app.router
        r.add_post("/volumes", route("volumes", self.create))
        r.add_get("/volumes", route("volumes", self.list), allow_head=False)
        r.add_get("/volumes/{vid}", route("volumes", self.get), allow_head=False)
        r.add_delete("/volumes/{vid}", route("volumes", self.destroy))

    def _answer(self, rec: VolumeRecord, status: int) -> web.Response:
        body = {"volumeID": rec.volume_id, "name": rec.name, "token": self._store.token(rec)}
        return web.json_response(body, status=status)

    async def create(self, request: web.Request) -> web.StreamResponse:
        """``POST /volumes`` ``{name}``: 201 ``VolumeAndToken``."""
        body = await json_body(request, optional=False)
        name = body.get("name")
        if not isinstance(name, str):
            raise BadRequest(
                "Error when parsing request: validation error: field 'name' must be a string"
            )
        rec = await self._server.loop.run_in_executor(None, self._store.create, name)
        return self._answer(rec, 201)

    async def list(self, request: web.Request) -> web.StreamResponse:
        """``GET /volumes``: every ``Volume`` of the team."""
        return web.json_response(
            [{"volumeID": r.volume_id, "name": r.name} for r in self._store.all()]
        )

    async def get(self, request: web.Request) -> web.StreamResponse:
        """``GET /volumes/{id}``: ``VolumeAndToken``; 400 malformed id, 404 unknown."""
        rec = self._store.get(parse_volume_id(request.match_info["vid"]))
        return self._answer(rec, 200)

    async def destroy(self, request: web.Request) -> web.StreamResponse:
        """``DELETE /volumes/{id}``: 204; the files go once no sandbox mounts the volume."""
        rec = self._store.get(parse_volume_id(request.match_info["vid"]))
        mounted = rec.volume_id in mounted_volume_ids(self._server.records.values())
        directory = self._store.destroy(rec, mounted)
        if directory is not None:
            await self._server.remove_files(directory)
        return web.Response(status=204)
