"""Recall that finds: a search of a 1 MB tool result, through the engine's recall (the handle
resolved, the content read, every line searched, the answer built under `recallMaxChars`).

The value is the slowest pattern's median, in ms (the issue's bound: 50 ms): a plain name on
one line, an RE2 expression with a few dozen matches, and a pattern that backtracks without
end in Python's `re` (RE2 runs it in one linear pass). The floor beside it is Python's
`str.find` over the same text — reading the megabyte once — so a busy machine shows in both.
"""

from __future__ import annotations

from compactd.context.engine import Engine
from compactd.context.recall import Search, handle_for
from compactd.context.stores.files import FileStore
from registry import Context, Measurement, case

LINES = 16_000  # ~1 MB of a build log: paths, numbers, an error here and there


def _log() -> str:
    out = []
    for i in range(1, LINES + 1):
        path = f"internal/pkg{i % 37}/file{i % 211}.go"
        if i % 467 == 0:
            out.append(f"{path}:{i}: error: undefined: handler{i} (type check failed)")
        else:
            out.append(f"ok  {path}:{i}  compiled {i * 13 % 997} objects in {i % 89}ms")
    return "\n".join(out) + "\n"


PATTERNS = {
    "plain name": Search("handler9341"),
    "regex, 34 matches": Search(r"error: undefined: handler\d+", regex=True, context=0),
    "backtracking in re": Search(r"(x+x+)+y", regex=True),
}


@case("recall_search_1mb_ms", target=50.0)
def recall_search_1mb_ms(ctx: Context) -> Measurement:
    """a recall search of a 1 MB tool result (ms, the slowest of three patterns), beside
    str.find over the same megabyte."""
    text = _log()
    with ctx.scratch(memory=True) as root:
        engine = Engine(FileStore(root))
        engine.open("big")
        use = {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "go build"}}
        engine.append(
            "big",
            messages=[
                {"role": "user", "content": "build it"},
                {"role": "assistant", "content": [use]},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t1", "content": text}],
                },
            ],
        )
        node = engine.session("big").graph.tool_by_use_id("t1")
        assert node is not None
        handle = handle_for("big", node.id)
        fns = {
            name: (lambda s=search: engine.recall("big", handle, search=s))
            for name, search in PATTERNS.items()
        }
        fns["str.find (floor)"] = lambda: text.find("handler9341")
        t = ctx.medians(fns)
        found = engine.recall("big", handle, search=PATTERNS["regex, 34 matches"])
        assert found.matches == LINES // 467, found.matches
    slowest = max(v for k, v in t.items() if k in PATTERNS)
    note = f"{len(text) / 1e6:.2f} MB, {LINES:,} lines"
    return Measurement(slowest * 1000, {k: v for k, v in t.items()}, note)
