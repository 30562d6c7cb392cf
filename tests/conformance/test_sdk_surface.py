"""Conformance: the official ``e2b`` SDK's control-plane surface against the emulator, with
both the sync (``Sandbox``, ``Template``) and the async (``AsyncSandbox``, ``AsyncTemplate``)
clients: list queries and paging, ``get_info``/``set_timeout``, template aliases, network
updates and traffic tokens, metrics, snapshots and forks.
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any, List

import pytest
import requests
from e2b import (
    ALL_TRAFFIC,
    AsyncSandbox,
    AsyncTemplate,
    Sandbox,
    SandboxException,
    SandboxQuery,
    SandboxState,
    Template,
)

from e2b_provider.emulator import Emulator

from .conftest import arun

pytestmark = [pytest.mark.conformance, pytest.mark.integration]

MIB = 1024 * 1024


def _port_get(emu: Emulator, sandbox_id: str, **headers: str) -> requests.Response:
    """A request to port 8000 of a sandbox through the emulator's edge."""
    base = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "8000"}
    return requests.get(emu.sandbox_url + "/", headers={**base, **headers}, timeout=30)


# -- list -----------------------------------------------------------------------------------


def _check_pages(pages: List[List[str]], expected: List[str]) -> None:
    assert all(len(p) == 1 for p in pages)
    assert [p[0] for p in pages] == expected


def test_list_query_and_paging_sync(sdk: Emulator) -> None:
    tag = uuid.uuid4().hex
    boxes = [Sandbox.create(metadata={"tag": tag}) for _ in range(3)]
    try:
        ids = [b.sandbox_id for b in boxes]
        first = boxes[0].get_info()
        query = SandboxQuery(
            metadata={"tag": tag},
            state=[SandboxState.RUNNING],
            started_after=first.started_at,
            template="base",
        )
        pager = Sandbox.list(query=query, limit=1, order="asc")
        pages = []
        while pager.has_next:
            pages.append([s.sandbox_id for s in pager.next_items()])
        _check_pages(pages, ids)
        after_first = first.started_at + datetime.timedelta(microseconds=1)
        later = SandboxQuery(metadata={"tag": tag}, started_after=after_first)
        assert {s.sandbox_id for s in Sandbox.list(query=later).next_items()} == set(ids[1:])
        desc = Sandbox.list(query=SandboxQuery(metadata={"tag": tag}), order="desc").next_items()
        assert [s.sandbox_id for s in desc] == ids[::-1]
        other = SandboxQuery(metadata={"tag": tag}, template="no-such-template")
        assert Sandbox.list(query=other).next_items() == []
        boxes[1].pause()
        paused = SandboxQuery(metadata={"tag": tag}, state=[SandboxState.PAUSED])
        assert [s.sandbox_id for s in Sandbox.list(query=paused).next_items()] == [ids[1]]
        with pytest.raises(SandboxException) as ei:
            Sandbox.list(next_token="not-a-token").next_items()
        assert ei.value.status_code == 400 and "Invalid next token" in str(ei.value)
        with pytest.raises(SandboxException) as ei:
            Sandbox.list(query=SandboxQuery(template="base:v1")).next_items()
        assert ei.value.status_code == 400
    finally:
        for b in boxes:
            b.kill()


def test_list_query_and_paging_async(sdk: Emulator) -> None:
    async def scenario() -> None:
        tag = uuid.uuid4().hex
        boxes = [await AsyncSandbox.create(metadata={"tag": tag}) for _ in range(3)]
        try:
            ids = [b.sandbox_id for b in boxes]
            first = await boxes[0].get_info()
            query = SandboxQuery(
                metadata={"tag": tag}, started_after=first.started_at, template="base"
            )
            pager = AsyncSandbox.list(query=query, limit=1, order="asc")
            pages = []
            while pager.has_next:
                pages.append([s.sandbox_id for s in await pager.next_items()])
            _check_pages(pages, ids)
            none = AsyncSandbox.list(query=SandboxQuery(metadata={"tag": tag}, template="x-y"))
            assert await none.next_items() == []
            with pytest.raises(SandboxException) as ei:
                await AsyncSandbox.list(next_token="not-a-token").next_items()
            assert ei.value.status_code == 400
        finally:
            for b in boxes:
                await b.kill()

    arun(scenario())


# -- info, timeout, templates ---------------------------------------------------------------


def _check_info(info: Any, sandbox_id: str) -> None:
    assert info.sandbox_id == sandbox_id and info.template_id == "base" and info.name == "base"
    assert info.state == SandboxState.RUNNING and info.cpu_count == 2 and info.memory_mb == 512
    assert info.lifecycle == {"on_timeout": "kill", "auto_resume": False}
    now = datetime.datetime.now(datetime.timezone.utc)
    assert abs((info.end_at - now).total_seconds() - 120) < 30


def test_info_timeout_and_template_exists_sync(sdk: Emulator) -> None:
    assert Template.exists("base") is True
    assert Template.exists("no-such-template") is False
    with Sandbox.create(timeout=30) as sb:
        sb.set_timeout(120)
        _check_info(sb.get_info(), sb.sandbox_id)
        _check_info(Sandbox.get_info(sb.sandbox_id), sb.sandbox_id)


def test_info_timeout_and_template_exists_async(sdk: Emulator) -> None:
    async def scenario() -> None:
        assert await AsyncTemplate.exists("base") is True
        assert await AsyncTemplate.exists("no-such-template") is False
        sb = await AsyncSandbox.create(timeout=30)
        try:
            await sb.set_timeout(120)
            _check_info(await sb.get_info(), sb.sandbox_id)
        finally:
            await sb.kill()

    arun(scenario())


# -- network --------------------------------------------------------------------------------

UPDATE = {"allow_out": ["example.com", "8.8.8.8"], "deny_out": [ALL_TRAFFIC], "dns_servers": []}


def _check_network(info: Any) -> None:
    assert info.network == {
        "allow_public_traffic": False,
        "allow_out": ["example.com", "8.8.8.8"],
        "deny_out": [ALL_TRAFFIC],
        "dns_servers": [],
    }


def _check_traffic_token(emu: Emulator, sandbox_id: str, token: Any) -> None:
    assert isinstance(token, str) and len(token) == 64
    assert _port_get(emu, sandbox_id).status_code == 403
    reached = _port_get(emu, sandbox_id, **{"e2b-traffic-access-token": token})
    assert reached.status_code == 502 and reached.json()["message"].endswith("port is not open")


def test_network_update_and_traffic_token_sync(sdk: Emulator) -> None:
    with Sandbox.create(network={"allow_public_traffic": False}) as sb:
        _check_traffic_token(sdk, sb.sandbox_id, sb.traffic_access_token)
        assert Sandbox.connect(sb.sandbox_id).traffic_access_token == sb.traffic_access_token
        assert sb.get_info().network == {"allow_public_traffic": False}
        sb.update_network(UPDATE)
        _check_network(sb.get_info())
        with pytest.raises(SandboxException) as ei:
            sb.update_network({"deny_out": ["example.com"]})
        assert ei.value.status_code == 400 and "invalid denied CIDR" in str(ei.value)
        sb.update_network({})
        assert sb.get_info().network == {"allow_public_traffic": False}
    with Sandbox.create() as open_box:
        assert open_box.traffic_access_token is None


def test_network_update_and_traffic_token_async(sdk: Emulator) -> None:
    async def scenario() -> None:
        sb = await AsyncSandbox.create(network={"allow_public_traffic": False})
        try:
            _check_traffic_token(sdk, sb.sandbox_id, sb.traffic_access_token)
            await sb.update_network(UPDATE)
            _check_network(await sb.get_info())
            await AsyncSandbox.update_network(sb.sandbox_id, {})
            assert (await sb.get_info()).network == {"allow_public_traffic": False}
        finally:
            await sb.kill()

    arun(scenario())


# -- metrics --------------------------------------------------------------------------------


def _check_metrics(metrics: List[Any]) -> None:
    assert metrics, "no metrics"
    m = metrics[-1]
    assert m.cpu_count == 2 and 0 <= m.cpu_used_pct <= 100
    assert m.mem_total == 512 * MIB and 0 < m.mem_used < m.mem_total
    assert m.disk_total == 1024 * MIB and m.disk_used > 0
    assert abs((m.timestamp - datetime.datetime.now(datetime.timezone.utc)).total_seconds()) < 60


def test_metrics_sync(sdk: Emulator) -> None:
    with Sandbox.create() as sb:
        _check_metrics(sb.get_metrics())
        _check_metrics(Sandbox.get_metrics(sb.sandbox_id))
        future = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
        assert sb.get_metrics(start=future) == []


def test_metrics_async(sdk: Emulator) -> None:
    async def scenario() -> None:
        sb = await AsyncSandbox.create()
        try:
            _check_metrics(await sb.get_metrics())
        finally:
            await sb.kill()

    arun(scenario())


# -- snapshots and forks --------------------------------------------------------------------


def test_snapshots_sync(sdk: Emulator) -> None:
    name = f"snap-{uuid.uuid4().hex[:8]}"
    with Sandbox.create() as sb:
        sb.files.write("/home/user/state.txt", "from the source")
        snap = sb.create_snapshot(name=name)
        assert snap.snapshot_id == f"local/{name}:default" and snap.names == [f"local/{name}"]
        unnamed = sb.create_snapshot(mode="filesystem")
        assert sb.is_running()
        listed = [s.snapshot_id for s in sb.list_snapshots().next_items()]
        assert listed == [unnamed.snapshot_id, snap.snapshot_id]
        by_name = Sandbox.list_snapshots(name=name).next_items()
        assert [s.snapshot_id for s in by_name] == [snap.snapshot_id]
        assert Template.exists(name) is True
        with Sandbox.create(snap.snapshot_id) as copy:
            assert copy.files.read("/home/user/state.txt") == "from the source"
            assert copy.get_info().name == name
        assert Sandbox.delete_snapshot(snap.snapshot_id) is True
        assert Sandbox.delete_snapshot(snap.snapshot_id) is False
        assert Sandbox.delete_snapshot(unnamed.snapshot_id) is True
        assert Template.exists(name) is False
        assert sb.list_snapshots().next_items() == []


def test_snapshots_async(sdk: Emulator) -> None:
    async def scenario() -> None:
        sb = await AsyncSandbox.create()
        try:
            await sb.files.write("/home/user/state.txt", "async source")
            snap = await sb.create_snapshot()
            page = await AsyncSandbox.list_snapshots(sandbox_id=sb.sandbox_id).next_items()
            assert [s.snapshot_id for s in page] == [snap.snapshot_id]
            copy = await AsyncSandbox.create(snap.snapshot_id)
            try:
                assert await copy.files.read("/home/user/state.txt") == "async source"
            finally:
                await copy.kill()
            assert await AsyncSandbox.delete_snapshot(snap.snapshot_id) is True
            assert await AsyncSandbox.delete_snapshot(snap.snapshot_id) is False
        finally:
            await sb.kill()

    arun(scenario())


def test_fork_sync(sdk: Emulator) -> None:
    with Sandbox.create(metadata={"role": "source"}) as sb:
        sb.files.write("/home/user/state.txt", "before the fork")
        handle = sb.commands.run("sleep 300", background=True)
        forks = sb.fork(count=2, timeout=120)
        try:
            assert len(forks) == 2 and all(isinstance(f, Sandbox) for f in forks)
            for fork in forks:
                assert isinstance(fork, Sandbox)
                assert fork.files.read("/home/user/state.txt") == "before the fork"
                assert fork.get_info().metadata == {"role": "source"}
                assert [p for p in fork.commands.list() if p.cmd == "sleep 300"] == []
            # the source was resumed in place, its processes alive
            assert any(p.pid == handle.pid for p in sb.commands.list())
            assert sb.is_running()
        finally:
            for fork in forks:
                if isinstance(fork, Sandbox):
                    fork.kill()
        sb.pause()
        with pytest.raises(SandboxException) as ei:
            Sandbox.fork(sb.sandbox_id)
        assert ei.value.status_code == 409


def test_fork_async(sdk: Emulator) -> None:
    async def scenario() -> None:
        sb = await AsyncSandbox.create()
        try:
            await sb.files.write("/home/user/state.txt", "async fork")
            (fork,) = await sb.fork()
            assert isinstance(fork, AsyncSandbox)
            try:
                assert await fork.files.read("/home/user/state.txt") == "async fork"
            finally:
                await fork.kill()
        finally:
            await sb.kill()

    arun(scenario())
