"""Background commands as root (``start(user="root")``) against the emulator, with the
python supervisor and with the shell one (a sandbox without ``python3``): they run as root,
their record is root's alone (the sandbox user can neither read it nor stand in for it),
any process finds them by their id, ``commands`` lists them, and their kill, ``kill_tagged``
and a timeout reach them."""

from __future__ import annotations

import subprocess
from typing import Dict, Iterator, Tuple

import pytest
from command_line import cli_env, run
from waiting import wait_until

from e2b_provider import (
    CommandFailed,
    CommandNotFound,
    E2BSandboxProvider,
    SandboxHandle,
)
from e2b_provider.emulator import Emulator
from e2b_provider.protocol.command_records import RECORDS, ROOT_RECORDS

from .conftest import NO_PYTHON, root, unique_name

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=["base", NO_PYTHON], ids=["python", "shell"])
def both(
    request: pytest.FixtureRequest, emulator: Emulator,
) -> Iterator[Tuple[E2BSandboxProvider, SandboxHandle]]:
    """A provider and its sandbox: with ``python3`` (the python supervisor) and without
    (``supervisor.sh`` and ``records.sh``)."""
    with E2BSandboxProvider(emulator.config(template=request.param)) as p:
        h = p.create(unique_name("bgroot"))
        try:
            yield p, h
        finally:
            p.destroy(h)


def _cid(command_id: str) -> str:
    return command_id.rpartition(":")[2].rpartition("-")[2]


def test_a_root_command_runs_as_root_and_its_record_is_roots_alone(
    both: Tuple[E2BSandboxProvider, SandboxHandle], emulator: Emulator,
) -> None:
    p, h = both
    c = p.start(h, "id -u; touch /root/made-by-bg && echo made; echo said >&2", user="root")
    assert c.id.startswith(f"{h.id}:root-") and len(_cid(c.id)) == 32, c.id
    r = c.wait(60)
    assert (r.exit_code, r.stdout, r.stderr) == (0, "0\nmade\n", "said\n"), r
    cid = _cid(c.id)
    # the record is in root's home: root sees it, the sandbox user cannot even look
    assert root(p, h, f"stat -c '%U %a' {ROOT_RECORDS} {ROOT_RECORDS}/{cid}") == (
        "root 700\nroot 700\n")
    looked = p.exec(h, f"ls {ROOT_RECORDS}; cat {ROOT_RECORDS}/{cid}/meta.json")
    assert looked.exit_code != 0 and "Permission denied" in looked.stderr, looked
    assert p.exec(h, f"test -e {RECORDS}/{cid}").exit_code == 1
    # another provider (another process would do the same) finds it by its id alone
    with E2BSandboxProvider(emulator.config(template="base")) as other:
        found = other.attach(h.id, c.id)
        assert found.id == c.id and not found.running
        assert (found.output().stdout, found.wait(30).stdout) == ("0\nmade\n", "0\nmade\n")


def test_a_sandbox_users_record_does_not_stand_in_for_roots(
    both: Tuple[E2BSandboxProvider, SandboxHandle],
) -> None:
    """The sandbox user plants a record (and a live process) under a root command's 32 hex
    digits in its own records directory: the root id still finds nothing."""
    p, h = both
    mine = p.start(h, "echo mine; sleep 60")
    try:
        forged = f"{h.id}:root-{_cid(mine.id)}"
        with pytest.raises(CommandNotFound, match="no background command"):
            p.attach(h, forged)
        assert forged not in [x.id for x in p.commands(h)]
    finally:
        mine.kill()


def test_root_commands_are_listed_killed_and_reached_by_kill_tagged_and_their_timeout(
    both: Tuple[E2BSandboxProvider, SandboxHandle],
) -> None:
    p, h = both
    tag = unique_name("rt").replace("-", "_")
    killed = p.start(h, "sleep 300", user="root")
    tagged = p.start(h, "sleep 301", user="root", tag=tag)
    timed = p.start(h, "echo go; sleep 302", user="root", timeout=2)
    mine = p.start(h, "sleep 303")
    try:
        listed = {x.id: x for x in p.commands(h)}
        assert {killed.id, tagged.id, mine.id} <= set(listed), listed
        assert listed[tagged.id].tag == tag and listed[killed.id].pid == killed.pid

        killed.kill()
        r = killed.wait(30)
        assert (r.exit_code, r.cancelled) == (None, True), r
        p.kill_tagged(h, [tag])
        r = tagged.wait(30)
        assert (r.exit_code, r.cancelled) == (137, False), r
        r = timed.wait(30)
        assert (r.timed_out, r.stdout) == (True, "go\n"), r
        # nothing of them runs, as root sees it; the sandbox user's command runs on
        assert root(p, h, "pgrep -x -f 'sleep 30[012]' || true") == ""
        wait_until(lambda: {x.id for x in p.commands(h)} == {mine.id}, 30,
                   "commands() listing only the sandbox user's command")
    finally:
        mine.kill()


def test_a_root_home_open_to_others_is_refused_with_what_to_do(
    both: Tuple[E2BSandboxProvider, SandboxHandle],
) -> None:
    """Root keeps no record where another account could make names: a ``/root`` open to
    others' writes stops the start, and the error says what to do."""
    p, h = both
    root(p, h, "chmod 0777 /root")
    try:
        with pytest.raises(CommandFailed, match=r"make /root root's own \(mode 0700\)"):
            p.start(h, "true", user="root")
    finally:
        root(p, h, "chmod 0700 /root")
    assert p.start(h, "echo again", user="root").wait(30).stdout == "again\n"


@pytest.fixture
def env(emu) -> Dict[str, str]:  # type: ignore[no-untyped-def]
    return cli_env(emu, COLUMNS="80")


def test_the_command_lines_start_u_root_logs_ps_and_kill(
    provider: E2BSandboxProvider, env: Dict[str, str],
) -> None:
    h = provider.create(unique_name("clibgroot"))
    try:
        def ok(*args: str) -> subprocess.CompletedProcess[str]:
            r = run(env, *args)
            assert r.returncode == 0, r.stderr
            return r

        cid = ok("start", "-u", "root", str(h.name), "id", "-u").stdout.strip()
        assert cid.startswith(f"{h.id}:root-"), cid
        wait_until(lambda: ok("logs", str(h.name), cid).stdout == "0\n", 30, "its output")
        # what follows the ':' names it too
        assert ok("logs", str(h.name), cid.rpartition(":")[2]).stdout == "0\n"
        sleeper = ok("start", "-u", "root", str(h.name), "sleep", "300").stdout.strip()
        assert sleeper in ok("ps", str(h.name)).stdout
        ok("kill", str(h.name), sleeper)
        wait_until(lambda: sleeper not in ok("ps", str(h.name)).stdout, 30,
                   "ps no longer listing the killed command")
    finally:
        provider.destroy(h)
