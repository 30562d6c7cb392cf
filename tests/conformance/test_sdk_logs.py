"""Conformance: sandbox logs through the official SDK's own generated API client (unmodified),
sync and async: ``GET /v2/sandboxes/{id}/logs`` (``get_v_2_sandboxes_sandbox_id_logs``) and
the legacy ``GET /sandboxes/{id}/logs`` (``get_sandboxes_sandbox_id_logs``), parsed into the
SDK's models, for a sandbox whose processes and file transfers the SDK drove.
"""

from __future__ import annotations

import asyncio
from typing import Any, List

import pytest
from e2b import Sandbox
from e2b.api.client.api.sandboxes import (
    get_sandboxes_sandbox_id_logs,
    get_v_2_sandboxes_sandbox_id_logs,
)
from e2b.api.client.client import AuthenticatedClient
from e2b.api.client.models import (
    Error,
    LogLevel,
    LogsDirection,
    SandboxLogEntry,
    SandboxLogs,
    SandboxLogsV2Response,
)
from waiting import wait_until

from e2b_provider.emulator import Emulator

pytestmark = [pytest.mark.conformance, pytest.mark.integration]


def _client(emu: Emulator) -> AuthenticatedClient:
    return AuthenticatedClient(
        base_url=emu.api_url, token=emu.api_key, prefix="", auth_header_name="X-API-KEY"
    )


def _events(entries: List[SandboxLogEntry], event_type: str) -> List[SandboxLogEntry]:
    return [e for e in entries if e.fields.additional_properties.get("event_type") == event_type]


def _v2(client: AuthenticatedClient, sandbox_id: str, **query: Any) -> List[SandboxLogEntry]:
    r = get_v_2_sandboxes_sandbox_id_logs.sync_detailed(sandbox_id, client=client, **query)
    assert r.status_code == 200, r.content
    assert isinstance(r.parsed, SandboxLogsV2Response)
    return list(r.parsed.logs)


def test_logs_with_the_generated_client_sync_and_async(sdk: Emulator) -> None:
    box = Sandbox.create()
    try:
        sid = box.sandbox_id
        assert box.commands.run("echo from-sdk").stdout == "from-sdk\n"
        box.files.write("/tmp/sdk-logged.txt", "x")
        assert box.files.read("/tmp/sdk-logged.txt") == "x"
        with _client(sdk) as client:

            def settled() -> List[SandboxLogEntry]:
                entries = _v2(client, sid, direction=LogsDirection.FORWARD)
                done = _events(entries, "process_end") and _events(entries, "file_read")
                return entries if done else []

            forward = wait_until(settled, 10, what="the agent's lines")
            backward = _v2(client, sid)
            assert [e.to_dict() for e in backward] == [e.to_dict() for e in forward[::-1]]
            stamps = [e.timestamp for e in forward]
            assert stamps == sorted(stamps) and all(s.tzinfo is not None for s in stamps)
            (start,) = _events(forward, "process_start")
            assert start.level == LogLevel.INFO
            assert start.fields["logger"] == "process" and start.fields["pid"].isdigit()
            assert start.message == f"Process with pid {start.fields['pid']} started"
            (written,) = _events(forward, "file_processing")
            assert written.fields["path"] == "/tmp/sdk-logged.txt"

            found = _v2(client, sid, search="Process with pid", level=LogLevel.INFO, limit=1)
            assert [e.to_dict() for e in found] == [
                e.to_dict() for e in backward if "Process with pid" in e.message
            ][:1]
            assert _v2(client, sid, level=LogLevel.ERROR) == []

            v1 = get_sandboxes_sandbox_id_logs.sync_detailed(sid, client=client)
            assert v1.status_code == 200 and isinstance(v1.parsed, SandboxLogs)
            assert [e.to_dict() for e in v1.parsed.log_entries] == [e.to_dict() for e in forward]
            assert [x.timestamp for x in v1.parsed.logs] == stamps

            too_many = get_v_2_sandboxes_sandbox_id_logs.sync_detailed(
                sid, client=client, limit=1001
            )
            assert too_many.status_code == 400
            unknown = get_v_2_sandboxes_sandbox_id_logs.sync_detailed(
                "inosuchsandbox000000", client=client
            )
            assert unknown.status_code == 404 and isinstance(unknown.parsed, Error)

            # no secret in any line
            v2 = get_v_2_sandboxes_sandbox_id_logs.sync_detailed(sid, client=client)
            text = v1.content.decode() + v2.content.decode()
            secrets = [sdk.api_key, box._envd_access_token]
            assert all(secrets) and not any(s in text for s in secrets if s)

        async def scenario() -> None:
            async with _client(sdk) as aclient:
                r = await get_v_2_sandboxes_sandbox_id_logs.asyncio_detailed(
                    sid, client=aclient, direction=LogsDirection.FORWARD, limit=2
                )
                assert isinstance(r.parsed, SandboxLogsV2Response)
                assert [e.to_dict() for e in r.parsed.logs] == [
                    e.to_dict() for e in forward[:2]
                ]
                old = await get_sandboxes_sandbox_id_logs.asyncio_detailed(
                    sid, client=aclient, limit=1
                )
                assert isinstance(old.parsed, SandboxLogs)
                assert [e.to_dict() for e in old.parsed.log_entries] == [forward[0].to_dict()]

        asyncio.run(scenario())
    finally:
        box.kill()
    with _client(sdk) as client:
        # E2B keeps a killed sandbox's logs for a while; so does the emulator
        after = _v2(client, sid, direction=LogsDirection.FORWARD)
        assert [e.to_dict() for e in after[: len(forward)]] == [e.to_dict() for e in forward]
