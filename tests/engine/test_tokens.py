"""Token estimates: the shipped vocabulary, and each node tokenized once."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from compactd.context import tokens
from compactd.context.engine import Engine
from compactd.context.tokens import Counter
from compactd.context.turns import turn_node_ids, turns_of

from tests.engine.helpers import (
    FORMATS,
    assistant,
    call,
    new_session,
    params,
    render,
    result,
    results,
    thinking,
    user,
)

REPO = Path(__file__).resolve().parents[2]


def test_encoding_loads_with_the_network_blocked(tmp_path: Path) -> None:
    """In a fresh process (so no cached encoder hides a download), with every socket refused
    and tiktoken's cache dir empty, the encoder still loads — from the shipped file."""
    script = textwrap.dedent(
        """
        import socket

        class NoNetwork(socket.socket):
            def __init__(self, *a, **k):
                raise OSError("network blocked by the test")

        socket.socket = NoNetwork
        socket.create_connection = lambda *a, **k: (_ for _ in ()).throw(OSError("blocked"))

        from compactd.context import tokens
        enc = tokens.encoding()
        assert enc.encode("hello world") == [15339, 1917], enc.encode("hello world")
        assert enc.name == "cl100k_base"
        assert tokens.Counter().text("The quick brown fox jumps over the lazy dog.") == 10
        print("ok")
        """
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "TIKTOKEN_CACHE_DIR": str(tmp_path / "tiktoken-cache"),
        "DATA_GYM_CACHE_DIR": str(tmp_path / "data-gym-cache"),
        "PYTHONPATH": str(REPO),
    }
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
    assert not (tmp_path / "tiktoken-cache").exists()


def test_vocabulary_is_hash_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "cl100k_base.tiktoken"
    bad.write_bytes(b"aGVsbG8= 0\n")
    monkeypatch.setattr(tokens, "_encoding", None)
    monkeypatch.setattr(tokens, "vocabulary_path", lambda: str(bad))
    with pytest.raises(ValueError, match=r"[Hh]ash"):
        tokens.encoding()


def _long(tag: str) -> str:
    """Longer than the short-string memo, so every count reaches the encoder."""
    return f"{tag}: " + " ".join(f"word{tag}{i}" for i in range(40))


def _turn(engine: Engine, sid: str, k: int) -> None:
    engine.append(
        sid,
        messages=[
            user(_long(f"u{k}")),
            assistant(thinking(_long(f"th{k}")), _long(f"a{k}"), call(f"c{k}", q=_long(f"i{k}"))),
            results(
                result(f"c{k}", _long(f"r{k}")),
                text=_long(f"m{k}"),
            ),
            assistant(_long(f"b{k}"), call(f"d{k}")),
            results(result(f"d{k}", [{"type": "text", "text": _long(f"rb{k}")}])),
            assistant(_long(f"e{k}")),
        ],
    )


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_node_is_tokenized_once(engine: Engine, counter: Counter, fmt: str) -> None:
    sid = new_session(engine, "once")
    for k in range(5):
        _turn(engine, sid, k)
    render(engine, sid, fmt, system=_long("sys"), tools=[{"name": "t", "input_schema": {}}])
    first = counter.calls
    assert first > 0
    for _ in range(3):
        render(engine, sid, fmt, system=_long("sys"), tools=[{"name": "t", "input_schema": {}}])
    assert counter.calls == first, "a warm render ran the encoder again"
    # a fresh engine on the same data has nothing cached, so it counts everything once more
    # (this proves the counter sees the work)
    other = Counter()
    Engine(engine.store, counter=other).render(sid, params(fmt))
    assert other.calls >= first - 3
    # one more turn costs about its own nodes: 13 long texts (the system and tools are memoized)
    _turn(engine, sid, 99)
    render(engine, sid, fmt, system=_long("sys"), tools=[{"name": "t", "input_schema": {}}])
    grown = counter.calls - first
    assert 1 <= grown <= 14, grown


def test_records_do_not_retokenize_on_every_render(engine: Engine, counter: Counter) -> None:
    """A summary marker's text is tokenized once, not on every render."""
    sid = new_session(engine, "recs")
    for k in range(4):
        _turn(engine, sid, k)
    s = engine.session(sid)
    path = s.graph.branch_path()
    old = turns_of(path)[:2]
    covers = [i for t in old for i in turn_node_ids(s.graph, path, t)]
    s.add_records(
        [
            {
                "kind": "summary",
                "covers": covers,
                "data": {"text": _long("summary"), "turns": [t.start_id for t in old]},
            }
        ]
    )
    render(engine, sid)
    warm = counter.calls
    render(engine, sid)
    assert counter.calls == warm
    render(engine, sid, "openai")
    warm = counter.calls
    render(engine, sid, "openai")
    render(engine, sid)
    assert counter.calls == warm
