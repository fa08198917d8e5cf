"""A history the client rewrote stays managed, on every wire, streamed or not: an agent's own
compaction (Claude Code's `/compact` and auto-compact, Codex's remote compaction) keeps its last
tool exchanges with the same ids, and such a history is a branch forked where it leaves the
session — ids are unique on a branch, not in the session. A request that cannot be kept goes
upstream as the client sent it, that request only, logged with why and counted on its session;
the next one is managed again."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.fake_anthropic import FakeAnthropic
from tests.support.fake_openai import FakeOpenAI
from tests.support.proxy import ProxyProcess
from tests.support.wires import WIRES, Call, Said, Step, User, Wire, reset, upstream_bodies

from .conftest import events_of

BIG = "".join(f"line {n}: a result long enough for Budget Reduction to cut\n" for n in range(200))
CUT = "truncated by compactd"  # in what the upstream is sent only when compactd rendered it

wires = pytest.mark.parametrize(
    "wire", [Wire(name, stream) for name in WIRES for stream in (False, True)], ids=str
)


def _managed(body: Any) -> bool:
    import orjson

    return CUT in orjson.dumps(body).decode()


@wires
def test_an_agent_s_own_compaction_is_a_branch_and_stays_managed(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI], wire: Wire
) -> None:
    session = f"rewrite-{wire.name}-{int(wire.stream)}"
    reset(fakes)
    ids = [f"call_{session}_{n}" for n in range(3)]
    history: list[Step] = [User("list every part")]
    for n, call_id in enumerate(ids):
        history.append(Call(call_id, BIG, f"cat part{n}"))
        response = wire.send(proxy.base_url, history, session)
        assert response.status_code == 200, response.text
    # the agent compacts: a summary, then the last exchange it kept, with its very id
    compacted: list[Step] = [User("Summary: parts 0 and 1 were listed."), history[-1]]
    for n in range(3):
        compacted = [*compacted, Said(f"noted {n}"), User(f"go on {n}")]
        response = wire.send(proxy.base_url, compacted, session)
        assert response.status_code == 200, response.text
    sent = upstream_bodies(fakes, wire)
    assert len(sent) == 6
    assert all(_managed(body) for body in sent), "a request went upstream unmanaged"
    assert "cannot be kept" not in proxy.log
    events = events_of(proxy.data_dir, session)
    calls = [e["n"] for e in events if e.get("t") == "node" and e["n"]["kind"] == "tool"]
    assert [c["tool_use_id"] for c in calls] == [*ids, ids[-1]]  # one per branch
    forks = [e["name"] for e in events if e.get("t") == "branch"]
    assert forks == ["fork-1"]  # one fork, the later requests extend it


@pytest.mark.parametrize("wire", [Wire("messages"), Wire("chat", True), Wire("responses")], ids=str)
def test_a_request_that_cannot_be_kept_passes_for_itself_only(
    proxy: ProxyProcess, fakes: tuple[FakeAnthropic, FakeOpenAI], wire: Wire
) -> None:
    """A result with no call before it cannot be kept (and the upstream refuses it too): it
    goes on as the client sent it, is logged with why and counted on the session, and the
    session's next request is managed again."""
    session = f"passes-{wire.name}"
    reset(fakes)
    history: list[Step] = [User("start"), Call(f"{session}-1", BIG)]
    assert wire.send(proxy.base_url, history, session).status_code == 200
    broken = wire.body([*history, Said("ok"), User("next")])
    orphan = Call(f"{session}-orphan", "x")
    body = wire.body([orphan])
    # a result whose call the history does not hold: keep only the result half
    if wire.name == "messages" or wire.name == "chat":
        broken["messages"].append(body["messages"][1])
    else:
        broken["input"].append(body["input"][1])
    import httpx2
    import orjson

    httpx2.post(
        proxy.base_url + wire.path,
        content=orjson.dumps(broken),
        headers=wire.headers(session),
        timeout=60,
    )
    passed = upstream_bodies(fakes, wire)[-1]
    assert passed == broken  # as the client sent it
    assert f"session {session}: its history cannot be kept" in proxy.log
    records = [e["r"] for e in events_of(proxy.data_dir, session) if e.get("t") == "record"]
    assert [r["data"]["reason"] for r in records if r["kind"] == "passthrough"]
    again = [*history, Said("ok"), User("next"), Call(f"{session}-2", BIG)]
    assert wire.send(proxy.base_url, again, session).status_code == 200
    assert _managed(upstream_bodies(fakes, wire)[-1])
