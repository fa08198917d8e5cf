"""Who sees what: the thread a viewer renders and how each function shows itself (DESIGN §3
step 2, the spec's `render_context`).

- The top-level viewer (`viewer=None`) renders its branch's thread. A completed function
  shows only its input and output (`expose="io"`, the default); its internals stay in the
  graph, readable through `session/get`.
- A function's own viewer (`viewer=<function id>`) renders that function's internal thread,
  fully, while it runs. With `callers=True` the caller's context up to the call comes first.
- `subcalls=True` shows completed sub-calls' internal transcripts inside their results (as
  `expose="full"` would); `expose` overrides every function's own mode for this render.
"""

from __future__ import annotations

import attrs

from .errors import InvalidContent, InvalidGraph
from .graph import EXPOSE_MODES, Graph, Node, Path


@attrs.frozen
class ViewOptions:
    branch: str | None = None
    viewer: str | None = None
    callers: bool = False
    subcalls: bool = False
    expose: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.expose is not None and self.expose not in EXPOSE_MODES:
            raise InvalidContent(f"expose must be one of {list(EXPOSE_MODES)}", field="expose")


@attrs.frozen
class View:
    """The threads a render walks, in order: an optional caller prefix, then the own thread."""

    own: Path
    caller: Path | None
    options: ViewOptions

    def expose_mode(self, fn: Node) -> str:
        if self.options.expose is not None:
            return self.options.expose
        if self.options.subcalls and fn.status != "running":
            return "full"
        return fn.expose


def resolve_view(graph: Graph, options: ViewOptions) -> View:
    if options.viewer is None:
        return View(graph.branch_path(options.branch), None, options)
    fn = graph.node(options.viewer)
    if fn.kind != "function":
        raise InvalidGraph(
            f"viewer {options.viewer!r} is not a function node", nodeId=options.viewer
        )
    own = graph.function_path(fn.id)
    caller = None
    if options.callers:
        call_site = graph.nodes[fn.parent] if fn.parent else None
        if call_site is not None and call_site.kind == "tool":
            call_site = graph.nodes[call_site.parent] if call_site.parent else None
        if call_site is not None and call_site.parent is not None:
            before = graph.nodes[call_site.parent]
            caller = graph.path(before.id) if before.is_thread else None
    return View(own, caller, options)
