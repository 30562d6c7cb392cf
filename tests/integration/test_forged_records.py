"""Background command records are the sandbox user's to write: what one says never steers a
kill to another command, and a record that is not made of regular files (a FIFO put in it)
never stalls a listing or an attach; with python3 (the file agent reads records) and
without it (``records.sh`` reads them, ``supervisor.sh`` writes them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Iterator, Tuple

import pytest
from waiting import wait_until

from e2b_provider import (
    CommandFailed,
    E2BSandboxProvider,
    SandboxHandle,
)
from e2b_provider.emulator import Emulator

from .conftest import root, unique_name
from .test_background import _alive

pytestmark = pytest.mark.integration

#: Where records are kept in the sandbox.
RECORDS = "/tmp/.capybara-cmd"
#: The longest a listing or an attach may take here (a FIFO stalled them 60 s or more).
PROMPT = 30.0


@pytest.fixture(scope="module", params=["base", "base-without-python3"])
def box(request: pytest.FixtureRequest,
        emulator: Emulator) -> Iterator[Tuple[E2BSandboxProvider, SandboxHandle]]:
    """A provider and a sandbox, with python3 and without."""
    with E2BSandboxProvider(emulator.config(template=request.param)) as p:
        h = p.create(unique_name("forged"))
        try:
            p.start(h, "true").wait(timeout=60)  # the records directory, as start makes it
            yield p, h
        finally:
            p.destroy(h)


def _forger(p: E2BSandboxProvider, h: SandboxHandle, cid: str) -> int:
    """Pid of a process (the sandbox user's) whose arguments hold ``cid``, as a supervisor's
    do: what the record readers check a record's pid against."""
    mark = f"/tmp/forger-{cid}"
    p.start(h, f"sh -c 'echo $$ > {mark}; sleep 300; :' capybara-bg {cid}")

    def pid() -> bytes:
        got = p.read_file(h, mark)
        return got.data if got is not None else b""

    wait_until(lambda: pid().endswith(b"\n"), 30, "the forger's pid")
    return int(pid().decode())


def _victim(p: E2BSandboxProvider, h: SandboxHandle) -> Tuple[str, str]:
    """A command that runs (``sleep`` with a unique length), and that length."""
    secs = str(300 + uuid.uuid4().int % 10000)
    c = p.start(h, f"sleep {secs}; true")
    wait_until(lambda: _alive(p, h, "-x", "-f", f"'sleep {secs}'"), 30, "the victim's sleep")
    return c.id, secs


def test_a_record_naming_another_commands_control_path_kills_nothing(
    box: Tuple[E2BSandboxProvider, SandboxHandle],
) -> None:
    p, h = box
    victim_id, secs = _victim(p, h)
    victim = p.attach(h, victim_id)
    fake = uuid.uuid4().hex
    meta = {"id": fake, "command": "forged", "ctl": victim._ctl, "started_at": time.time(),
            "cap": 1024, "stdin": False, "timeout": 0.0, "pid": _forger(p, h, fake)}
    p.exec(h, f"mkdir -m 700 {RECORDS}/{fake}")
    p.write_file(h, f"{RECORDS}/{fake}/meta.json", json.dumps(meta).encode())
    # and one that says it is the victim's record
    twin = uuid.uuid4().hex
    same = dict(meta, id=victim_id.rsplit(":", 1)[1], pid=_forger(p, h, twin))
    p.exec(h, f"mkdir -m 700 {RECORDS}/{twin}")
    p.write_file(h, f"{RECORDS}/{twin}/meta.json", json.dumps(same).encode())
    listed = [c.id for c in p.commands(h)]
    assert listed.count(victim_id) == 1 and f"{h.id}:{fake}" not in listed, listed
    assert f"{h.id}:{twin}" not in listed
    forged = p.attach(h, f"{h.id}:{fake}")
    forged.kill()
    assert _alive(p, h, "-x", "-f", f"'sleep {secs}'"), "the forged record's kill hit another"
    assert victim.running
    # a real record altered to name the victim: its kill still stops its own command alone
    own_id, own_secs = _victim(p, h)
    own = own_id.rsplit(":", 1)[1]
    altered = json.loads(root(p, h, f"cat {RECORDS}/{own}/meta.json"))
    altered["ctl"] = victim._ctl
    p.write_file(h, f"{RECORDS}/{own}/meta.json", json.dumps(altered).encode())
    p.attach(h, own_id).kill()
    wait_until(lambda: not _alive(p, h, "-x", "-f", f"'sleep {own_secs}'"), 30,
               "the altered record's own command killed")
    assert _alive(p, h, "-x", "-f", f"'sleep {secs}'"), "the altered record's kill hit another"
    victim.kill()
    assert victim.wait(timeout=30).cancelled


def test_a_fifo_as_meta_json_is_left_out_of_the_list_and_named_by_attach(
    box: Tuple[E2BSandboxProvider, SandboxHandle], emulator: Emulator,
) -> None:
    p, h = box
    good = p.start(h, "sleep 300")
    fake = uuid.uuid4().hex
    p.exec(h, f"mkdir -m 700 {RECORDS}/{fake} && mkfifo {RECORDS}/{fake}/meta.json")
    began = time.monotonic()
    listed = [c.id for c in p.commands(h)]
    assert time.monotonic() - began < PROMPT
    assert good.id in listed and f"{h.id}:{fake}" not in listed
    began = time.monotonic()
    with pytest.raises(CommandFailed, match=f"record of command {h.id}:{fake} is damaged"
                                            r".*meta\.json"):
        p.attach(h, f"{h.id}:{fake}")
    assert time.monotonic() - began < PROMPT
    # the command line's ps, a process of its own
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env.update(E2B_API_URL=emulator.api_url, E2B_SANDBOX_URL=emulator.sandbox_url,
               E2B_API_KEY=emulator.api_key, E2B_TEMPLATE="base", COLUMNS="200")
    ps = subprocess.run([sys.executable, "-m", "e2b_provider", "ps", h.id], env=env,
                        capture_output=True, text=True, timeout=2 * PROMPT)
    assert ps.returncode == 0, ps.stderr
    assert [row.split()[0] for row in ps.stdout.splitlines()[1:]].count(good.id) == 1
    assert fake not in ps.stdout
    good.kill()


@pytest.mark.parametrize("name", ["status.json", "stdout.0", "stderr.0"])
def test_a_fifo_in_a_record_is_a_typed_error_naming_it(
    box: Tuple[E2BSandboxProvider, SandboxHandle], name: str,
) -> None:
    p, h = box
    c = p.start(h, "echo out; echo err >&2", max_output_bytes=4096)
    assert c.wait(timeout=60).stdout == "out\n"
    cid = c.id.rsplit(":", 1)[1]
    p.exec(h, f"cd {RECORDS}/{cid} && rm -f {name} && mkfifo {name}")
    began = time.monotonic()
    with pytest.raises(CommandFailed, match=f"record of command {c.id} is damaged.*{name}"):
        p.attach(h, c.id).output()
    with pytest.raises(CommandFailed, match=f"record of command {c.id} is damaged.*{name}"):
        c.wait(timeout=PROMPT)
    assert time.monotonic() - began < 2 * PROMPT


def test_waiting_for_a_link_loop_says_it_is_one(
    box: Tuple[E2BSandboxProvider, SandboxHandle],
) -> None:
    p, h = box
    a, b = f"/tmp/{unique_name('loop')}", f"/tmp/{unique_name('loop')}"
    p.exec(h, f"ln -s {b} {a} && ln -s {a} {b}")
    began = time.monotonic()
    with pytest.raises(CommandFailed, match="too many levels of symbolic links"):
        p.wait_for_file(h, a, timeout=120)
    assert time.monotonic() - began < 60  # at once, not at the timeout
    # one made while it waits is said as soon as it is made, not at the timeout
    c, d = f"/tmp/{unique_name('loop')}", f"/tmp/{unique_name('loop')}"
    made = threading.Timer(1.0, lambda: p.exec(h, f"ln -s {c} {d} && ln -s {d} {c}"))
    made.start()
    began = time.monotonic()
    try:
        with pytest.raises(CommandFailed, match="too many levels of symbolic links"):
            p.wait_for_file(h, c, timeout=120)
    finally:
        made.join()
    assert time.monotonic() - began < 60


@pytest.mark.parametrize("template", ["base", "base-without-python3"])
def test_a_records_directory_of_another_account_is_named_once_with_what_to_do(
    emulator: Emulator, template: str,
) -> None:
    with E2BSandboxProvider(emulator.config(template=template)) as p:
        h = p.create(unique_name("notown"))
        try:
            root(p, h, f"mkdir -m 755 {RECORDS}")
            with pytest.raises(CommandFailed) as got:
                p.start(h, "true")
            said = str(got.value)
            assert said.startswith(f"starting a background command in sandbox {h.id} failed")
            assert said.count(RECORDS) == 1 and said.count("own directory") == 1, said
            assert "remove that directory as root" in said, said
        finally:
            p.destroy(h)
