"""The emulator's control-plane surface over real HTTP: list filters and paging, template
aliases, network settings and traffic tokens, metrics, snapshots and forks.

Everything runs against real sandboxes through the session's emulator subprocess.
"""

from __future__ import annotations

import datetime
import re
import time
import uuid
from typing import Any, Callable, Dict, List
from urllib.parse import quote, urlencode

import pytest
import requests
from waiting import wait_until

from e2b_provider.emulator import Emulator

from .test_server import detail, run

pytestmark = pytest.mark.integration

Make = Callable[..., Dict[str, Any]]
MIB = 1024 * 1024


def _list(api: requests.Session, emu: Emulator, **params: Any) -> requests.Response:
    return api.get(emu.api_url + "/v2/sandboxes", params=params, timeout=30)


def _ids(r: requests.Response) -> List[str]:
    assert r.status_code == 200, r.text
    return [s["sandboxID"] for s in r.json()]


def _error(r: requests.Response, status: int) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["code"] == status
    message: str = body["message"]
    return message


# -- list -----------------------------------------------------------------------------------


def test_list_filters_order_and_paging(
    emu: Emulator, api: requests.Session, make_sandbox: Make
) -> None:
    tag = uuid.uuid4().hex
    meta = urlencode({quote("tag"): quote(tag)})
    first = make_sandbox(metadata={"tag": tag})["sandboxID"]
    started = detail(api, emu, first)["startedAt"]
    later = [make_sandbox(metadata={"tag": tag})["sandboxID"] for _ in range(2)]
    ids = [first, *later]

    # startedAfter is inclusive: the first sandbox's own start time keeps it
    assert sorted(_ids(_list(api, emu, metadata=meta, startedAfter=started))) == sorted(ids)
    start_dt = datetime.datetime.fromisoformat(started.replace("Z", "+00:00"))
    after = (start_dt + datetime.timedelta(microseconds=1)).astimezone(
        datetime.timezone(datetime.timedelta(hours=2))
    )
    assert sorted(_ids(_list(api, emu, metadata=meta, startedAfter=after.isoformat()))) == sorted(
        later
    )
    future = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1))
    assert _ids(_list(api, emu, metadata=meta, startedAfter=future.isoformat())) == []

    # order, and paging one by one in each order
    assert _ids(_list(api, emu, metadata=meta, order="asc")) == ids
    assert _ids(_list(api, emu, metadata=meta)) == ids[::-1]
    for order, expected in (("asc", ids), ("desc", ids[::-1])):
        seen: List[str] = []
        token = None
        while True:
            params: Dict[str, Any] = {"metadata": meta, "order": order, "limit": 1}
            if token:
                params["nextToken"] = token
            r = _list(api, emu, **params)
            seen += _ids(r)
            token = r.headers.get("x-next-token")
            if not token:
                break
            other = "desc" if order == "asc" else "asc"
            r2 = _list(api, emu, metadata=meta, order=other, nextToken=token)
            assert _error(r2, 400) == "Invalid next token"
        assert seen == expected

    # template filter: base (by alias), none for an unknown template
    r = _list(api, emu, metadata=meta, template="base")
    assert sorted(_ids(r)) == sorted(ids)
    assert r.headers["X-Total-Running"] == "3"
    r = _list(api, emu, metadata=meta, template="no-such-template")
    assert _ids(r) == [] and r.headers["X-Total-Running"] == "0"
    r = _list(api, emu, metadata=meta, template="no-such-template", state="paused")
    assert _ids(r) == [] and "X-Total-Running" not in r.headers

    # X-Total-Running counts every match, before paging
    r = _list(api, emu, metadata=meta, limit=1)
    assert len(_ids(r)) == 1 and r.headers["X-Total-Running"] == "3"


@pytest.mark.parametrize(
    "params, message",
    [
        ({"state": "running,stopped"}, 'parameter "state"'),
        ({"order": "up"}, 'parameter "order"'),
        ({"startedAfter": "yesterday"}, 'parameter "startedAfter"'),
        ({"startedAfter": "2026-02-30T00:00:00Z"}, 'parameter "startedAfter"'),
        ({"limit": "0"}, 'parameter "limit"'),
        ({"limit": "101"}, 'parameter "limit"'),
        ({"limit": "ten"}, 'parameter "limit"'),
        ({"template": "base:v1"}, "tags are not supported"),
        ({"template": "bad name!"}, "Invalid template"),
        ({"metadata": "a=b=c"}, "Error parsing metadata"),
        ({"nextToken": "bm90IGEgdG9rZW4="}, "Invalid next token"),
    ],
)
def test_list_refuses_bad_values(
    emu: Emulator, api: requests.Session, params: Dict[str, str], message: str
) -> None:
    assert message in _error(_list(api, emu, **params), 400)


# -- templates ------------------------------------------------------------------------------


def test_template_aliases(emu: Emulator, api: requests.Session) -> None:
    base = emu.api_url + "/templates/aliases/"
    msg = _error(api.get(base + "base", timeout=30), 403)
    assert msg == "You don't have access to this template alias"
    assert _error(api.get(base + "no-such-alias", timeout=30), 404) == (
        "template 'no-such-alias' not found"
    )
    assert "Invalid alias format" in _error(api.get(base + "bad%20name", timeout=30), 400)
    assert "must match your team" in _error(api.get(base + "other%2Fname", timeout=30), 400)
    assert _error(api.delete(emu.api_url + "/templates/base", timeout=30), 403)
    assert _error(api.delete(emu.api_url + "/templates/nothing", timeout=30), 404)


# -- network --------------------------------------------------------------------------------


def test_network_settings_are_validated_recorded_and_replaced(
    emu: Emulator, api: requests.Session, make_sandbox: Make
) -> None:
    r = api.post(
        emu.api_url + "/v2/sandboxes",
        json={"templateID": "base", "network": {"allowOut": ["example.com"]}},
        timeout=60,
    )
    assert "ALL_TRAFFIC" in _error(r, 400)
    sb = make_sandbox(
        network={"allowOut": ["example.com"], "denyOut": ["0.0.0.0/0"], "dnsServers": ["1.1.1.1"]}
    )
    sid = sb["sandboxID"]
    assert detail(api, emu, sid)["network"] == {
        "allowOut": ["example.com"],
        "denyOut": ["0.0.0.0/0"],
        "dnsServers": ["1.1.1.1"],
    }
    url = f"{emu.api_url}/sandboxes/{sid}/network"
    update = {
        "allowOut": ["8.8.8.8", "10.0.0.0/8"],
        "denyOut": ["0.0.0.0/0"],
        "rules": {"api.example.com": [{"transform": {"headers": {"X-Key": "v"}}}]},
        "egressProxy": {"address": "proxy.example.com:1080", "username": "u", "password": "pw"},
        "allow_internet_access": False,
    }
    assert api.put(url, json=update, timeout=30).status_code == 204
    d = detail(api, emu, sid)
    assert d["allowInternetAccess"] is False
    assert d["network"] == {
        "allowOut": ["8.8.8.8", "10.0.0.0/8"],
        "denyOut": ["0.0.0.0/0"],
        "rules": {"api.example.com": [{"transform": {"headers": {"X-Key": "v"}}}]},
        "egressProxy": {"address": "proxy.example.com:1080", "username": "u"},  # no password
    }
    # every egress field is replaced: an empty update clears them
    assert api.put(url, json={}, timeout=30).status_code == 204
    assert detail(api, emu, sid)["network"] == {}
    for bad, message in (
        ({"denyOut": ["example.com"]}, "invalid denied CIDR example.com"),
        ({"denyOut": ["0.0.0.0"]}, "invalid denied CIDR 0.0.0.0"),
        ({"allowOut": ["::"]}, "invalid allowed address ::"),
        ({"allowOut": ["a.example"]}, "ALL_TRAFFIC"),
        ({"rules": {"bad domain": []}}, "is not a valid domain name"),
        ({"egressProxy": {"address": "no-port"}}, "Invalid egress proxy config"),
        ({"dnsServers": ["::1"]}, "invalid DNS server"),
        ({"allowOut": "8.8.8.8"}, "validation error"),
    ):
        assert message in _error(api.put(url, json=bad, timeout=30), 400)
    assert "validation error" in _error(api.put(url, data=b"", timeout=30), 400)
    unknown = f"{emu.api_url}/sandboxes/i{'0' * 20}/network"
    _error(api.put(unknown, json={}, timeout=30), 404)
    assert api.post(f"{emu.api_url}/sandboxes/{sid}/pause", timeout=60).status_code == 204
    _error(api.put(url, json={}, timeout=30), 404)


def test_private_traffic_needs_the_traffic_token(
    emu: Emulator, api: requests.Session, make_sandbox: Make
) -> None:
    sb = make_sandbox(network={"allowPublicTraffic": False})
    token = sb["trafficAccessToken"]
    assert re.fullmatch(r"[0-9a-f]{64}", token) and token != sb["envdAccessToken"]
    assert detail(api, emu, sb["sandboxID"])["network"] == {"allowPublicTraffic": False}
    assert "trafficAccessToken" not in make_sandbox()
    port = {"E2b-Sandbox-Id": sb["sandboxID"], "E2b-Sandbox-Port": "8000"}

    def get(**headers: str) -> requests.Response:
        return requests.get(emu.sandbox_url + "/", headers={**port, **headers}, timeout=30)

    r = get()
    assert r.status_code == 403 and "is missing" in r.json()["message"]
    r = get(**{"e2b-traffic-access-token": "0" * 64})
    assert r.status_code == 403 and "is invalid" in r.json()["message"]
    r = get(**{"e2b-traffic-access-token": token})
    assert r.status_code == 502 and r.json()["message"].endswith("port is not open")
    # envd's own port does not need it
    out, _ = run(emu, sb, "echo ok")
    assert out == "ok\n"


# -- metrics --------------------------------------------------------------------------------


def test_metrics_from_the_sandbox(emu: Emulator, api: requests.Session, make_sandbox: Make) -> None:
    sb = make_sandbox()
    sid = sb["sandboxID"]
    url = f"{emu.api_url}/sandboxes/{sid}/metrics"
    r = api.get(url, timeout=30)
    assert r.status_code == 200, r.text
    (first,) = r.json()
    assert first["cpuCount"] == 2 and 0 <= first["cpuUsedPct"] <= 100
    assert first["memTotal"] == 512 * MIB and 0 < first["memUsed"] < first["memTotal"]
    assert first["diskTotal"] == 1024 * MIB and first["memCache"] >= 0
    assert abs(first["timestampUnix"] - time.time()) < 60
    assert first["timestamp"].startswith(time.strftime("%Y-", time.gmtime(first["timestampUnix"])))
    run(emu, sb, "head -c 8388608 /dev/urandom > /home/user/blob")

    def grown() -> bool:
        latest = api.get(url, timeout=30).json()[-1]
        return bool(latest["diskUsed"] >= first["diskUsed"] + 8 * MIB)

    wait_until(grown, 30, "the disk use to count an 8 MiB file")
    samples = api.get(url, timeout=30).json()
    assert len(samples) >= 2 and samples == sorted(samples, key=lambda s: s["timestamp"])
    assert api.get(url, params={"end": 0}, timeout=30).json() == []
    assert "number must be at least 0" in _error(api.get(url, params={"start": -1}), 400)
    many = api.get(
        emu.api_url + "/sandboxes/metrics",
        params={"sandbox_ids": f"{sid},i{'0' * 20}"},
        timeout=30,
    )
    assert many.status_code == 200 and list(many.json()["sandboxes"]) == [sid]
    r = api.get(emu.api_url + "/sandboxes/metrics", timeout=30)
    assert "sandbox_ids" in _error(r, 400)
    ids = ",".join(f"i{n:020d}" for n in range(101))
    r = api.get(emu.api_url + "/sandboxes/metrics", params={"sandbox_ids": ids}, timeout=30)
    assert "Too many sandboxes" in _error(r, 400)
    _error(api.get(f"{emu.api_url}/sandboxes/i{'0' * 20}/metrics", timeout=30), 404)


# -- snapshots and forks --------------------------------------------------------------------


def _pids_of(emu: Emulator, sb: Dict[str, Any], pattern: str) -> str:
    # "[x]yz" matches "xyz" but not this command line itself
    out, _ = run(emu, sb, f"pgrep -f '[{pattern[0]}]{pattern[1:]}' || true")
    return out.strip()


def test_snapshot_create_list_boot_and_delete(
    emu: Emulator, api: requests.Session, make_sandbox: Make
) -> None:
    src = make_sandbox(metadata={"role": "source"})
    sid = src["sandboxID"]
    run(emu, src, "echo kept > /home/user/note")
    run(emu, src, "echo sys > /opt/added", user="root")  # an overlay (upper dir) change
    run(emu, src, "nohup sleep 321 >/dev/null 2>&1 &")
    name = f"snap-{uuid.uuid4().hex[:8]}"
    r = api.post(f"{emu.api_url}/sandboxes/{sid}/snapshots", json={"name": name}, timeout=120)
    assert r.status_code == 201, r.text
    assert r.json() == {"snapshotID": f"local/{name}:default", "names": [f"local/{name}"]}
    # the source keeps running, with its processes
    assert detail(api, emu, sid)["state"] == "running"
    assert _pids_of(emu, src, "sleep 321")
    unnamed = api.post(f"{emu.api_url}/sandboxes/{sid}/snapshots", json={}, timeout=120).json()
    assert re.fullmatch(r"[a-z0-9]{20}:default", unnamed["snapshotID"]) and unnamed["names"] == []
    v2 = api.post(
        f"{emu.api_url}/sandboxes/{sid}/snapshots", json={"name": f"{name}:v2"}, timeout=120
    ).json()
    assert v2["snapshotID"] == f"local/{name}:v2"

    def listed(**params: str) -> List[str]:
        r = api.get(emu.api_url + "/snapshots", params=params, timeout=30)
        assert r.status_code == 200, r.text
        return [s["snapshotID"] for s in r.json()]

    newest_first = [v2["snapshotID"], unnamed["snapshotID"], f"local/{name}:default"]
    assert listed(sandboxID=sid) == newest_first
    assert sorted(listed(name=name)) == [f"local/{name}:default", f"local/{name}:v2"]
    assert listed(name=f"{name}:v2") == [f"local/{name}:v2"]
    assert listed(name="no-such-snapshot") == []
    page1 = api.get(emu.api_url + "/snapshots", params={"sandboxID": sid, "limit": 2}, timeout=30)
    token = page1.headers["x-next-token"]
    page2 = api.get(
        emu.api_url + "/snapshots", params={"sandboxID": sid, "nextToken": token}, timeout=30
    )
    assert [s["snapshotID"] for s in page1.json() + page2.json()] == listed(sandboxID=sid)
    alias = api.get(f"{emu.api_url}/templates/aliases/{name}", timeout=30)
    assert alias.status_code == 200 and alias.json()["public"] is False
    assert "tag 'v3'" in _error(api.get(f"{emu.api_url}/templates/aliases/{name}:v3"), 404)

    # a sandbox from the snapshot: the files, not the processes, and its own hostname
    new = make_sandbox(templateID=f"local/{name}")
    assert new["templateID"] == alias.json()["templateID"] and new["alias"] == name
    out, _ = run(emu, new, "cat /home/user/note /opt/added /etc/hostname; hostname")
    assert out == f"kept\nsys\n{new['sandboxID']}\n{new['sandboxID']}\n"
    assert _pids_of(emu, new, "sleep 321") == ""
    from_id = make_sandbox(templateID=unnamed["snapshotID"])
    assert run(emu, from_id, "cat /home/user/note")[0] == "kept\n"
    listed_new = _ids(_list(api, emu, template=f"local/{name}"))
    assert listed_new == [new["sandboxID"]]
    r = api.post(emu.api_url + "/v2/sandboxes", json={"templateID": f"{name}:v9"}, timeout=60)
    assert "tag 'v9' does not exist" in _error(r, 404)

    # delete (as the SDK does: the snapshot id as one path segment)
    target = quote(f"local/{name}:default", safe="")
    assert api.delete(f"{emu.api_url}/templates/{target}", timeout=60).status_code == 204
    assert listed(name=name) == []
    _error(api.delete(f"{emu.api_url}/templates/{target}", timeout=60), 404)
    r = api.post(emu.api_url + "/v2/sandboxes", json={"templateID": f"local/{name}"}, timeout=60)
    _error(r, 404)
    # the sandbox made from it keeps its own copy
    assert run(emu, new, "cat /home/user/note")[0] == "kept\n"
    missing = f"{emu.api_url}/sandboxes/i{'0' * 20}/snapshots"
    _error(api.post(missing, json={}, timeout=30), 404)
    bad = api.post(f"{emu.api_url}/sandboxes/{sid}/snapshots", json={"name": "Bad Name"})
    assert "Invalid name" in _error(bad, 400)


def test_fork_copies_files_and_keeps_the_source_running(
    emu: Emulator, api: requests.Session, make_sandbox: Make
) -> None:
    src = make_sandbox(metadata={"role": "fork-source"}, envVars={"FROM": "source"}, timeout=600)
    sid = src["sandboxID"]
    run(emu, src, "echo forked > /home/user/data")
    run(emu, src, "nohup sleep 432 >/dev/null 2>&1 &")
    end_at = detail(api, emu, sid)["endAt"]
    r = api.post(f"{emu.api_url}/sandboxes/{sid}/fork", json={"count": 2, "timeout": 120})
    assert r.status_code == 201, r.text
    results = r.json()
    assert len(results) == 2 and all(set(x) == {"sandbox"} for x in results)
    forks = [x["sandbox"] for x in results]
    try:
        assert len({f["sandboxID"] for f in forks} | {sid}) == 3
        for fork in forks:
            out, _ = run(emu, fork, 'cat /home/user/data; echo "$FROM"')
            assert out == "forked\nsource\n"
            assert _pids_of(emu, fork, "sleep 432") == ""
            d = detail(api, emu, fork["sandboxID"])
            assert d["metadata"] == {"role": "fork-source"} and d["state"] == "running"
        # forks are independent copies
        run(emu, forks[0], "echo changed > /home/user/data")
        assert run(emu, forks[1], "cat /home/user/data")[0] == "forked\n"
        assert run(emu, src, "cat /home/user/data")[0] == "forked\n"
        # the source kept its processes, id and end time
        assert _pids_of(emu, src, "sleep 432")
        assert detail(api, emu, sid)["endAt"] == end_at
    finally:
        for fork in forks:
            api.delete(f"{emu.api_url}/sandboxes/{fork['sandboxID']}", timeout=60)
    url = f"{emu.api_url}/sandboxes/{sid}/fork"
    assert "at least 1" in _error(api.post(url, json={"count": 0}, timeout=30), 400)
    assert "greater than 100" in _error(api.post(url, json={"count": 101}, timeout=30), 400)
    assert "greater than 0" in _error(api.post(url, json={"timeout": 0}, timeout=30), 400)
    _error(api.post(f"{emu.api_url}/sandboxes/i{'0' * 20}/fork", timeout=30), 404)
    assert api.post(f"{emu.api_url}/sandboxes/{sid}/pause", timeout=60).status_code == 204
    assert "is paused" in _error(api.post(url, json={}, timeout=30), 409)
