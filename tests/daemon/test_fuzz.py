"""A fuzz suite against the real daemon over stdio: hypothesis draws frames (broken headers,
lengths, bytes), request ids and every method's params, and after each example checks that
the daemon answered, is still alive, wrote nothing when it refused, and never sent a traceback,
a local path or an internal error.

The budget is bounded for `make test` (examples per test from `COMPACTD_FUZZ_EXAMPLES`,
default below; derandomized so CI is reproducible). Raise it and set
`COMPACTD_FUZZ_RANDOM=1` to hunt: `COMPACTD_FUZZ_EXAMPLES=2000 COMPACTD_FUZZ_RANDOM=1
.venv/bin/python -m pytest tests/daemon/test_fuzz.py`.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import attrs
import pytest
import pytest_asyncio
from compactd.protocol.convert import camel
from compactd.protocol.types import METHODS
from hypothesis import given
from hypothesis import strategies as st

from tests.support.fuzz import budget

from .convo import assistant, tool_use, user
from .test_hardening import assert_clean, snapshot
from .wire import RawDaemon, frame, seeded_daemon

pytestmark = pytest.mark.asyncio(loop_scope="module")

TRANSCRIPTS = Path(__file__).resolve().parents[1] / "data" / "transcripts"

SID = "fuzz-main"
FUZZ = budget(100)  # ~20 s for the module
_n = itertools.count(1)

# ---- strategies ---------------------------------------------------------------------------

# text with lone surrogates too (`"\\ud83d"` once got −32700 with id null): the stdlib
# encoder writes them as escapes, as JSON.stringify does for a string cut mid-emoji
surrogate_text = st.lists(st.sampled_from(["a", "\ud83d", "\ude00", "é", "😀", " "]), max_size=5)
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    surrogate_text.map("".join),
)
json_values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)
ids = st.one_of(
    st.text(max_size=8),
    st.integers(-(2**60), 2**60),
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.lists(leaves, max_size=2),
    st.dictionaries(st.text(max_size=4), leaves, max_size=2),
)
# methods that never write: the frame fuzz may run any of them any number of times
READ_ONLY = ["session/list", "daemon/status", "session/get", "context/measure", "no/such"]

requests = st.fixed_dictionaries(
    {"jsonrpc": st.just("2.0"), "method": st.sampled_from(READ_ONLY)},
    optional={
        "id": ids,
        "params": st.one_of(
            json_values, st.fixed_dictionaries({"sessionId": st.sampled_from([SID, "a\n", ""])})
        ),
    },
).map(lambda m: json.dumps(m).encode())
lengths = st.one_of(
    st.integers(-5, 300).map(lambda n: str(n).encode()),
    st.integers(64 * 2**20 + 1, 2**80).map(lambda n: str(n).encode()),
    st.binary(max_size=8),
    st.sampled_from([b"", b" 5", b"5x", b"0x10", b"1e3", b"+5"]),
)
frame_parts = st.one_of(
    requests.map(frame),
    json_values.map(lambda v: frame(json.dumps(v).encode())),
    st.binary(max_size=60).map(frame),
    st.builds(
        lambda n, body: b"Content-Length: " + n + b"\r\n\r\n" + body,
        lengths,
        st.binary(max_size=40),
    ),
    st.builds(lambda n, body: b"Content-Length: " + n + b"\r\n\r\n" + body, lengths, requests),
    st.sampled_from([b"\r\n", b"X-Junk: 1\r\n", b"no colon\r\n", b"Content-Type: a\r\n\r\n"]),
    st.binary(max_size=60),
)
FLUSH = b"\n" * 400  # completes any header block or short body a part left open


NAMED: dict[str, st.SearchStrategy[Any]] = {
    "sessionId": st.sampled_from([SID, SID, "fuzz-none", "a\n", "", "../x"]),
    "path": st.sampled_from(["/dev/zero", "/no/such.jsonl", "", ".", "a\x00b", "/dev/stdin"]),
    "branch": st.sampled_from(["main", "nope", "", "b\n"]),
    "name": st.sampled_from(["f", "main", "", "x/y"]),
    "model": st.sampled_from(["claude-sonnet-4-5", "gpt-4o", ""]),
    "messages": st.lists(
        st.sampled_from([user("x"), assistant("y"), assistant("z", tool_use("fz"))]), max_size=3
    ),
}


def plausible(tp: Any) -> st.SearchStrategy[Any]:
    """A value of the wire type `tp` (so requests get past structuring into the engine)."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is str:
        return st.text(max_size=10)
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.integers(-10, 300_000) | st.integers(-(2**63), 2**64)
    if tp is float:
        return st.floats(allow_nan=False, allow_infinity=False) | st.integers(-10, 10**6)
    if tp is type(None):
        return st.none()
    if origin is Literal:
        return st.sampled_from(args)
    if origin in (Union, UnionType):
        return st.one_of([plausible(arg) for arg in args])
    if origin is list:
        return st.lists(plausible(args[0]), max_size=3)
    if origin is dict:
        return st.dictionaries(st.text(max_size=8), json_values, max_size=3)
    if attrs.has(tp):
        return shaped(tp)
    return json_values


def shaped(cls: type) -> st.SearchStrategy[dict[str, Any]]:
    """Params of `cls`: its camelCase fields, each of its type (or a named plausible value)
    most of the time and any JSON now and then; optional fields come and go."""
    hints = get_type_hints(cls)
    required: dict[str, st.SearchStrategy[Any]] = {}
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for field in attrs.fields(cls):
        name = camel(field.name)
        good = NAMED.get(name, plausible(hints[field.name]))
        value = st.one_of(good, good, good, good, json_values)
        (required if field.default is attrs.NOTHING else optional)[name] = value
    return st.fixed_dictionaries(required, optional=optional)


def params_for(method: str) -> st.SearchStrategy[Any]:
    """Mostly well-typed params (so the engine is reached), sometimes any JSON at all."""
    params = shaped(METHODS[method][0])
    return st.one_of(params, params, params, params, json_values)


# ---- the daemon ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def data_dir(root: Path) -> Path:
    return root / "data"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def daemon(root: Path, data_dir: Path) -> AsyncIterator[RawDaemon]:
    hello = [user("hello"), assistant("hi"), user("go on")]
    async with seeded_daemon(data_dir, {SID: hello}, "--summary-provider", "digest") as raw:
        yield raw
    assert "unexpected error" not in raw.log_text()  # no handler hit an unplanned exception


async def alive(daemon: RawDaemon, start: int) -> list[dict[str, Any]]:
    """Flush, then a probe that must be answered; the replies received before it."""
    probe_id = f"fuzz-probe-{next(_n)}"
    daemon.write(
        FLUSH
        + frame(json.dumps({"jsonrpc": "2.0", "id": probe_id, "method": "daemon/status"}).encode())
    )
    await daemon.drain()
    answer = await daemon.response(probe_id, start=start)
    assert answer["result"]["version"]
    replies = daemon.replies_since(start)
    return replies[: replies.index(answer)]


def check_replies(replies: list[dict[str, Any]], data_dir: Path) -> None:
    for reply in replies:
        assert_clean(reply, data_dir)
        if "error" in reply:
            assert reply["error"]["code"] != -32603, reply


# ---- the suites ----------------------------------------------------------------------------


@FUZZ
@given(parts=st.lists(frame_parts, min_size=1, max_size=4))
async def test_fuzz_frames_and_ids(daemon: RawDaemon, data_dir: Path, parts: list[bytes]) -> None:
    before = snapshot(data_dir)
    start = len(daemon.received)
    daemon.write(b"".join(parts))
    replies = await alive(daemon, start)
    check_replies(replies, data_dir)
    assert snapshot(data_dir) == before  # only methods that never write were sent
    assert daemon.violations == []


@pytest.mark.parametrize("method", sorted(METHODS))
@FUZZ
@given(data=st.data())
async def test_fuzz_every_method_params(
    daemon: RawDaemon, data_dir: Path, method: str, data: st.DataObject
) -> None:
    params = data.draw(params_for(method), label="params")
    omit = data.draw(st.integers(0, 9), label="omit params") == 0
    before = snapshot(data_dir)
    start = len(daemon.received)
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": f"fz-{next(_n)}", "method": method}
    if not omit:
        message["params"] = params
    daemon.write(frame(json.dumps(message).encode()))
    await daemon.drain()
    reply = await daemon.response(message["id"], start=start, timeout=60)
    check_replies([reply], data_dir)
    if "error" in reply:
        assert snapshot(data_dir) == before, f"{method} wrote although refused: {reply}"
    await alive(daemon, len(daemon.received))


# ---- crafted transcripts ---------------------------------------------------------------------


def _base(path: Path, keep: int) -> tuple[str, Any]:
    """A real transcript cut short (the first `keep` records, or a document's lists cut to
    `keep` items): what the mutations start from."""
    if path.suffix == ".jsonl":
        lines = path.read_bytes().splitlines()[:keep]
        return path.name, [json.loads(line) for line in lines if line.strip()]

    def cut(value: Any) -> Any:
        if isinstance(value, list):
            return [cut(v) for v in value[:keep]]
        if isinstance(value, dict):
            return {k: cut(v) for k, v in value.items()}
        return value

    return path.name, cut(json.loads(path.read_text()))


BASES = [
    _base(TRANSCRIPTS / "claude-code/fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl", 40),
    _base(next((TRANSCRIPTS / "codex").glob("*.jsonl")), 60),
    _base(TRANSCRIPTS / "openhands/multi_swe_bench_output.jsonl", 1),
    _base(TRANSCRIPTS / "swe-agent/pydicom__pydicom-1458.traj", 12),
    *(_base(p, 12) for p in sorted(TRANSCRIPTS.glob("*/*.json"))),
]
weird = st.one_of(
    json_values,
    st.dictionaries(st.sampled_from(["type", "id", "0", "x"]), json_values, max_size=2),
    st.lists(json_values, max_size=2),
    st.integers(-5, 5),
)


def mutated(data: st.DataObject) -> tuple[str, Any]:
    """A base with one value somewhere inside it (a record's `type`, an id, a list) replaced
    by a value of another shape."""
    name, content = data.draw(st.sampled_from(BASES), label="base")
    content = json.loads(json.dumps(content))  # a copy to change
    holder: Any = content
    for _ in range(data.draw(st.integers(1, 5), label="depth")):
        keys = list(holder) if isinstance(holder, dict) else list(range(len(holder)))
        if not keys:
            break
        key = data.draw(st.sampled_from(keys), label="key")
        if not isinstance(holder[key], dict | list) or data.draw(st.booleans(), label="stop"):
            holder[key] = data.draw(weird, label="value")
            return name, content
        holder = holder[key]
    return name, content


@FUZZ
@given(data=st.data())
async def test_fuzz_crafted_transcripts(
    daemon: RawDaemon, root: Path, data_dir: Path, data: st.DataObject
) -> None:
    """A real transcript with one value of another shape: imported, or refused with a typed
    error (never an internal one) that writes nothing."""
    name, content = mutated(data)
    path = root / "crafted" / f"{next(_n)}-{name}"
    path.parent.mkdir(exist_ok=True)
    if isinstance(content, list) and name.endswith(".jsonl"):
        path.write_text("".join(json.dumps(record) + "\n" for record in content))
    else:
        path.write_text(json.dumps(content))
    before = snapshot(data_dir)
    reply = await daemon.request("session/import", {"path": str(path)})
    check_replies([reply], data_dir)
    if "error" in reply:
        assert snapshot(data_dir) == before, f"a refused import wrote: {reply}"
