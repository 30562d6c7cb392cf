"""Secrets never show: the API key and envd access tokens in no log record, error or repr."""

from __future__ import annotations

import logging
import threading

import pytest
from waiting import last_request, wait_until

from e2b_provider import (
    Cancelled,
    CancelToken,
    E2BSandboxProvider,
    FilesFailed,
    SandboxGoneError,
)

from .conftest import no_file_agent, unique_name

pytestmark = pytest.mark.integration


def test_no_secret_in_any_log_record_error_or_repr(emu, caplog) -> None:  # type: ignore[no-untyped-def]
    config = emu.config(template="base")
    seen_errors = []
    with caplog.at_level(logging.DEBUG):  # every logger, urllib3's included
        with E2BSandboxProvider(config, kill_bound=3.0, kill_grace=0.5) as p:
            # the per-call scripts here (the stalls below are for their streams); the file
            # agent's calls are logged below, after this provider is closed
            no_file_agent(p)
            h = p.create(unique_name("secret"))
            target = p._ctx.attach(h.id, None)
            token = target.access_token
            assert token and token not in repr(target)
            p.exec(h, "echo hi", timeout=30.0)
            p.exec(h, "sleep 30", timeout=0.5)  # timeout path: kill script + SIGKILL
            p.write_file(h, "/workspace/s.txt", b"s")
            p.read_file(h, "/workspace/s.txt")
            # Cancelled, before any I/O: every call with a token that already fired
            tok = CancelToken()
            tok.cancel("x")
            for call in (
                lambda: p.exec(h, "true", cancel=tok),
                lambda: p.write_file(h, "/workspace/s.txt", b"t", cancel=tok),
                lambda: p.read_file(h, "/workspace/s.txt", cancel=tok),
                lambda: p.stat(h, "/workspace/s.txt", cancel=tok),
                lambda: p.resume(h, cancel=tok),
                lambda: p.suspend(h, cancel=tok),
                lambda: p.destroy(h, cancel=tok),
                lambda: p.create(unique_name("secret"), cancel=tok),
            ):
                with pytest.raises(Cancelled) as ei:
                    call()
                seen_errors.append(ei.value)
            # Cancelled while the request is under way: a read whose stream stalls
            mark = last_request(emu)
            emu.stream_stall(sandbox_id=h.id)
            late = CancelToken()

            def cancel_once_stalled() -> None:
                wait_until(
                    lambda: [
                        e
                        for e in emu.requests(sandbox_id=h.id)
                        if e["seq"] > mark and e.get("stalled")
                    ],
                    30.0,
                    "the read's stream to stall",
                )
                late.cancel("stop")

            canceller = threading.Thread(target=cancel_once_stalled)
            canceller.start()
            with pytest.raises(Cancelled) as ei:
                p.read_file(h, "/workspace/s.txt", cancel=late)
            canceller.join(30)
            seen_errors.append(ei.value)
            assert p.read_file(h, "/workspace/s.txt").data == b"s"  # type: ignore[union-attr]
            emu.stream_stall(sandbox_id=h.id)
            p.exec(h, "sleep 30", timeout=0.5)  # wedged: grace runs out, reboot
            p.destroy(h)
            try:
                p.exec(h, "true")
            except SandboxGoneError as exc:
                seen_errors.append(exc)
            emu.no_token()
            try:
                p.create(unique_name("secret"))
            except SandboxGoneError as exc:
                seen_errors.append(exc)
            texts = [repr(p), repr(config), str(config)]
        with E2BSandboxProvider(config) as q:  # the file agent's calls, its stream ended
            h = q.create(unique_name("secret"))
            agent_token = q._ctx.attach(h.id, None).access_token
            q.write_file(h, "/workspace/a.txt", b"a")
            wait_until(lambda: q._files._agents.sessions() != [], 30.0, "the file agent")
            q.read_files(h, ["/workspace/a.txt"])
            q.list_dir(h, "/workspace")
            [session] = q._files._agents.sessions()
            q.exec(h, f"kill -9 {session.pid}", timeout=30.0)  # ends the session, logged
            assert q.read_file(h, "/workspace/a.txt").data == b"a"  # type: ignore[union-attr]
            try:
                q.write_files(h, {"/etc/passwd": b"x"})
            except FilesFailed as exc:
                seen_errors.append(exc)
            q.destroy(h)
            texts += [repr(q)]
    assert len(seen_errors) == 12
    assert [type(e) for e in seen_errors[:9]] == [Cancelled] * 9
    texts += [str(e) for e in seen_errors] + [repr(e) for e in seen_errors]
    texts += [r.getMessage() for r in caplog.records]
    texts += [str(r.args) for r in caplog.records]
    assert any("rebooted" in t for t in texts)  # the logs did cover the reboot path
    for secret in (config.api_key, token, agent_token):
        assert not [t for t in texts if secret in t]
