"""The RPC methods: each one validates its params (via `rpc`) and calls the engine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..context.budget import Budget, known_model
from ..context.engine import RenderParams as EngineRenderParams
from ..context.policy import policy_from_config
from ..context.render.request import RequestSpec
from ..context.session import UNSET
from ..context.visibility import ViewOptions
from ..protocol import methods as m
from ..protocol import types as t
from ..service.app import App
from ..service.compaction import compact, render_with_cascade, replay_transcript
from ..service.events import compaction_event, render_tokens
from ..service.stoppable import run_stoppable
from .rpc import rpc

if TYPE_CHECKING:
    from .server import CompactdServer

WINDOW_PARAMS = "window and maxOutputTokens"  # a client may name them in its own words


def engine_params(p: t.RenderParams | t.CompactParams | t.SnipParams) -> EngineRenderParams:
    view = ViewOptions(
        branch=p.branch,
        viewer=getattr(p, "viewer", None),
        callers=getattr(p, "callers", False),
        subcalls=getattr(p, "subcalls", False),
        expose=getattr(p, "expose", None),
    )
    spec = RequestSpec(
        model=p.model,
        window=p.window,
        max_output_tokens=p.max_output_tokens,
        system=p.system,
        tools=p.tools,
        response_schema=getattr(p, "response_schema", None),
        format=p.format,
        cache=getattr(p, "cache", True),
        cache_ttl=getattr(p, "cache_ttl", None),
        recall=getattr(p, "recall", None),
        fallback_models=tuple(getattr(p, "fallback_models", None) or ()),
    )
    return EngineRenderParams(view=view, spec=spec)


def assumptions(p: t.RenderParams, budget: Budget) -> list[str]:
    """What the budget assumed that the client did not say: an unknown model's window, and
    the output reserve the request was then measured with (the one the panel shows)."""
    if p.model and p.window is None and not known_model(p.model):
        return [
            f"unknown model {p.model!r}: assumed a {budget.window:,}-token window and a "
            f"{budget.output_reserve:,}-token output reserve ({WINDOW_PARAMS} say otherwise)"
        ]
    return []


def register(server: Any, app: App) -> None:
    engine = app.engine

    @rpc(server, m.SESSION_OPEN)
    def session_open(ls: CompactdServer, p: t.OpenParams) -> t.OpenResult:
        session, created = engine.open(p.session_id, p.config)
        app.registry.get(session.id)
        g = session.graph
        return t.OpenResult(session.id, g.current_branch, g.head(), created)

    @rpc(server, m.SESSION_LIST)
    def session_list(ls: CompactdServer, p: t.ListParams) -> t.ListResult:
        out = []
        for sid in engine.list():
            if p.prefix is not None and not sid.startswith(p.prefix):
                continue
            stat = engine.store.stat(sid)
            loaded = sid in engine.sessions
            summary = engine.summary(sid, (stat.size, stat.mtime))
            out.append(
                t.SessionInfo(
                    sid,
                    stat.size,
                    stat.mtime,
                    loaded,
                    source=summary.source,
                    title=summary.title,
                    turns=summary.turns,
                    tokens=summary.tokens,
                )
            )
        out.sort(key=lambda info: (-info.modified, info.session_id))  # newest first
        return t.ListResult(out)

    @rpc(server, m.SESSION_GET)
    def session_get(ls: CompactdServer, p: t.GetParams) -> dict[str, Any]:
        app.session(p.session_id)
        return engine.inspect(p.session_id, p.node_id, p.branch)

    @rpc(server, m.SESSION_APPEND)
    def session_append(
        ls: CompactdServer, p: t.AppendParams, raw: dict[str, Any]
    ) -> t.AppendResult:
        app.session(p.session_id)
        result = engine.append(
            p.session_id,
            messages=p.messages,
            nodes=p.nodes,
            format=p.format,
            branch=p.branch,
            function=p.function_id,
            expected_head=p.expected_head if "expectedHead" in raw else UNSET,
        )
        return t.AppendResult(result.head, result.node_ids)

    @rpc(server, m.SESSION_TOOL_RESULT)
    def tool_result(ls: CompactdServer, p: t.ToolResultParams) -> t.HeadResult:
        session = app.session(p.session_id)
        return t.HeadResult(session.tool_result(p.tool_use_id, p.content, p.is_error).head)

    @rpc(server, m.FUNCTION_START)
    def function_start(ls: CompactdServer, p: t.FunctionStartParams) -> t.FunctionStartResult:
        session = app.session(p.session_id)
        fid = session.function_start(
            p.name,
            p.input,
            tool_use_id=p.tool_use_id,
            parent=p.parent,
            expose=p.expose,
            branch=p.branch,
            function=p.function_id,
        )
        return t.FunctionStartResult(fid)

    @rpc(server, m.FUNCTION_COMPLETE)
    def function_complete(ls: CompactdServer, p: t.FunctionCompleteParams) -> t.HeadResult:
        session = app.session(p.session_id)
        session.function_complete(p.function_id, p.output, p.status)
        return t.HeadResult(session.graph.head())

    @rpc(server, m.SESSION_BRANCH)
    def session_branch(ls: CompactdServer, p: t.BranchParams) -> t.BranchResult:
        session = app.session(p.session_id)
        return t.BranchResult(p.name, session.create_branch(p.name, p.from_node))

    @rpc(server, m.SESSION_CHECKOUT)
    def session_checkout(ls: CompactdServer, p: t.CheckoutParams) -> t.BranchResult:
        session = app.session(p.session_id)
        return t.BranchResult(p.branch, session.checkout(p.branch))

    @rpc(server, m.SESSION_IMPORT)
    async def session_import(ls: CompactdServer, p: t.ImportParams) -> t.ImportResult:
        async with app.front.progress(p.work_done_token, "compactd: importing") as report:
            report(p.path)
            # read and written in a worker thread: a big transcript never holds up the loop;
            # a cancel stops it before it writes, and is answered once it has stopped
            sessions, outcome = await run_stoppable(
                lambda stopped: engine.import_sessions(p.path, new=p.new, stopped=stopped)
            )
        for session in sessions:
            engine.sessions[session.id] = session
        return t.ImportResult(outcome.session_ids, outcome.warnings, outcome.existing)

    @rpc(server, m.CONTEXT_RENDER)
    async def context_render(ls: CompactdServer, p: t.RenderParams) -> t.RenderResult:
        session = app.session(p.session_id)
        params = engine_params(p)
        if not p.dry_run:  # a preview is not the request the idle work prepares for
            app.last_params[session.id] = params
        # an overflow the client reported makes this render run Tier 5 even without `cascade`:
        # the same request would only be rejected again
        reported = engine.take_overflow(session.id, keep=p.dry_run)
        if p.cascade or p.overflow is not None or reported is not None:
            rendered, events = await render_with_cascade(
                app,
                session.id,
                params,
                p.overflow,
                reported,
                p.work_done_token,
                dry_run=p.dry_run,
            )
        else:
            rendered, events = engine.render(session.id, params, remember=not p.dry_run), []
        if not p.dry_run:
            app.touch(session)
        return t.RenderResult(
            rendered.request,
            render_tokens(rendered.tokens()),
            [compaction_event(e) for e in events],
            rendered.headers,
            assumptions(p, rendered.budget),
        )

    @rpc(server, m.CONTEXT_MEASURE)
    def context_measure(ls: CompactdServer, p: t.RenderParams) -> t.MeasureResult:
        session = app.session(p.session_id)
        rendered = engine.render(session.id, engine_params(p), remember=False)
        tokens = rendered.tokens()
        return t.MeasureResult(
            total=tokens["total"],
            window=tokens["window"],
            limit=tokens["limit"],
            free=tokens["free"],
            output_reserve=tokens["outputReserve"],
            categories=tokens["categories"],
            threshold=int(engine.policy(session).cascade_threshold * tokens["limit"]),
            advice=engine.measure_advice(session, rendered),
            turns=tokens["turns"],
            turns_shown=tokens["turnsShown"],
            warnings=assumptions(p, rendered.budget),
        )

    @rpc(server, m.CONTEXT_COMPACT)
    async def context_compact(ls: CompactdServer, p: t.CompactParams) -> t.CompactResult:
        session = app.session(p.session_id)
        return await compact(app, session.id, engine_params(p), p.instructions, p.work_done_token)

    @rpc(server, m.CONTEXT_SNIP)
    def context_snip(ls: CompactdServer, p: t.SnipParams) -> t.SnipResult:
        session = app.session(p.session_id)
        outcome = engine.snip(session.id, engine_params(p), p.target_tokens)
        for event in outcome.events:
            if event.applied:
                app.notify_compacted(session.id, event)
        snip = next((e for e in outcome.events if e.tier == "snip"), None)
        applied = bool(snip and snip.applied)
        return t.SnipResult(
            applied=applied,
            removed_turns=snip.details.get("removedTurns", 0) if applied and snip else 0,
            tokens_before=outcome.tokens_before,
            tokens_after=outcome.rendered.total,
            reason=snip.reason if snip else "already under the target",
        )

    @rpc(server, m.CONTEXT_UNCOLLAPSE)
    def context_uncollapse(ls: CompactdServer, p: t.UncollapseParams) -> t.UncollapseResult:
        session = app.session(p.session_id)
        record_id = engine.uncollapse(session.id, p.collapse_id)
        return t.UncollapseResult(record_id is not None, record_id)

    @rpc(server, m.CONTEXT_RECALL)
    def context_recall(ls: CompactdServer, p: t.RecallParams) -> t.RecallResult:
        session = app.session(p.session_id)
        got = engine.recall(session.id, p.handle, p.start_line, p.end_line, p.branch)
        return t.RecallResult(
            got.text, got.total_lines, got.start_line, got.end_line, got.truncated
        )

    @rpc(server, m.CONTEXT_REPORT_USAGE)
    def report_usage(ls: CompactdServer, p: t.ReportUsageParams) -> t.ReportUsageResult:
        session = app.session(p.session_id)
        report = engine.report(
            session.id,
            p.model,
            p.usage,
            p.error and (p.error.status, p.error.message),
            p.applied_edits,
        )
        return t.ReportUsageResult(
            report.ratio, report.reported, report.estimated, report.overflow, report.limit
        )

    @rpc(server, m.SESSION_REPLAY)
    async def session_replay(ls: CompactdServer, p: t.ReplayParams) -> dict[str, Any]:
        return await replay_transcript(app, p)

    @rpc(server, m.DAEMON_STATUS)
    def status(ls: CompactdServer, p: t.StatusParams) -> t.StatusResult:
        from .. import __version__

        return t.StatusResult(
            __version__,
            engine.store.location,
            app.registry.loaded(),
            engine.summary_provider,
            # the threshold in force for sessions without their own (the spec's 90 minutes
            # unless --idle-seconds said otherwise), never a 0 that means nothing
            policy_from_config(engine.defaults).idle_seconds,
        )
