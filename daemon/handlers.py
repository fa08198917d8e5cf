"""The RPC methods: each one validates its params (via `rpc`) and calls the engine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..context.policy import policy_from_config
from ..context.recall import Search
from ..context.render.request import Rendered
from ..context.session import UNSET, Session
from ..protocol import methods as m
from ..protocol import types as t
from ..service.app import App
from ..service.compaction import compact, render_with_cascade, replay_transcript
from ..service.events import compaction_event, render_tokens
from ..service.reader import assumptions, engine_params, measure, proxied_sums
from ..service.reader import session_list as listing
from ..service.stoppable import run_stoppable
from .rpc import rpc

if TYPE_CHECKING:
    from .server import CompactdServer


def register(server: Any, app: App) -> None:
    """Every method: params checked by `rpc` on the loop, the engine's work in the session's
    turn off it (`App.run`), so one session's load or render never holds up another's."""
    engine = app.engine

    @rpc(server, m.SESSION_OPEN)
    async def session_open(ls: CompactdServer, p: t.OpenParams) -> t.OpenResult:
        def work() -> t.OpenResult:
            session, created = engine.open(p.session_id, p.config)
            g = app.session(session.id).graph
            return t.OpenResult(session.id, g.current_branch, g.head(), created)

        # a named session in its turn (two opens of one id never race); a new id has none yet
        return await app.work.run(p.session_id, work)

    @rpc(server, m.SESSION_LIST)
    async def session_list(ls: CompactdServer, p: t.ListParams) -> t.ListResult:
        listed = await app.listing(p.prefix)
        proxied = await app.work.run(None, lambda: proxied_sums(engine.store)) if listed else {}
        return listing(listed, engine.sessions, proxied)

    @rpc(server, m.SESSION_GET)
    async def session_get(ls: CompactdServer, p: t.GetParams) -> dict[str, Any]:
        return await app.run(p.session_id, lambda s: engine.inspect(s.id, p.node_id, p.branch))

    @rpc(server, m.SESSION_APPEND)
    async def session_append(
        ls: CompactdServer, p: t.AppendParams, raw: dict[str, Any]
    ) -> t.AppendResult:
        def work(session: Session) -> t.AppendResult:
            result = engine.append(
                session.id,
                messages=p.messages,
                nodes=p.nodes,
                format=p.format,
                branch=p.branch,
                function=p.function_id,
                expected_head=p.expected_head if "expectedHead" in raw else UNSET,
            )
            return t.AppendResult(result.head, result.node_ids)

        return await app.run(p.session_id, work)

    @rpc(server, m.SESSION_TOOL_RESULT)
    async def tool_result(ls: CompactdServer, p: t.ToolResultParams) -> t.HeadResult:
        return await app.run(
            p.session_id,
            lambda s: t.HeadResult(s.tool_result(p.tool_use_id, p.content, p.is_error).head),
        )

    @rpc(server, m.FUNCTION_START)
    async def function_start(ls: CompactdServer, p: t.FunctionStartParams) -> t.FunctionStartResult:
        def work(session: Session) -> t.FunctionStartResult:
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

        return await app.run(p.session_id, work)

    @rpc(server, m.FUNCTION_COMPLETE)
    async def function_complete(ls: CompactdServer, p: t.FunctionCompleteParams) -> t.HeadResult:
        def work(session: Session) -> t.HeadResult:
            session.function_complete(p.function_id, p.output, p.status)
            return t.HeadResult(session.graph.head())

        return await app.run(p.session_id, work)

    @rpc(server, m.SESSION_BRANCH)
    async def session_branch(ls: CompactdServer, p: t.BranchParams) -> t.BranchResult:
        return await app.run(
            p.session_id, lambda s: t.BranchResult(p.name, s.create_branch(p.name, p.from_node))
        )

    @rpc(server, m.SESSION_CHECKOUT)
    async def session_checkout(ls: CompactdServer, p: t.CheckoutParams) -> t.BranchResult:
        return await app.run(p.session_id, lambda s: t.BranchResult(p.branch, s.checkout(p.branch)))

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
        params = engine_params(p)
        if not p.dry_run:  # a preview is not the request the idle work prepares for
            app.last_params[p.session_id] = params
        # an overflow the client reported makes this render run Tier 5 even without `cascade`:
        # the same request would only be rejected again
        reported = engine.take_overflow(p.session_id, keep=p.dry_run)
        if p.cascade or p.overflow is not None or reported is not None:
            rendered, events = await render_with_cascade(
                app,
                p.session_id,
                params,
                p.overflow,
                reported,
                p.work_done_token,
                touch=not p.dry_run,
                dry_run=p.dry_run,
            )
        else:

            def work(session: Session) -> Rendered:
                rendered = engine.render(session.id, params, remember=not p.dry_run)
                if not p.dry_run:
                    app.touch(session)
                return rendered

            rendered, events = await app.run(p.session_id, work), []
        return t.RenderResult(
            rendered.request,
            render_tokens(rendered.tokens()),
            [compaction_event(e) for e in events],
            rendered.headers,
            assumptions(p, rendered.budget),
        )

    @rpc(server, m.CONTEXT_MEASURE)
    async def context_measure(ls: CompactdServer, p: t.RenderParams) -> t.MeasureResult:
        return await app.run(p.session_id, lambda session: measure(engine, session, p))

    @rpc(server, m.CONTEXT_COMPACT)
    async def context_compact(ls: CompactdServer, p: t.CompactParams) -> t.CompactResult:
        return await compact(app, p.session_id, engine_params(p), p.instructions, p.work_done_token)

    @rpc(server, m.CONTEXT_SNIP)
    async def context_snip(ls: CompactdServer, p: t.SnipParams) -> t.SnipResult:
        outcome = await app.run(
            p.session_id, lambda s: engine.snip(s.id, engine_params(p), p.target_tokens)
        )
        for event in outcome.events:
            if event.applied:
                app.notify_compacted(p.session_id, event)
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
    async def context_uncollapse(ls: CompactdServer, p: t.UncollapseParams) -> t.UncollapseResult:
        record_id = await app.run(p.session_id, lambda s: engine.uncollapse(s.id, p.collapse_id))
        return t.UncollapseResult(record_id is not None, record_id)

    @rpc(server, m.CONTEXT_RECALL)
    async def context_recall(ls: CompactdServer, p: t.RecallParams) -> t.RecallResult:
        search = Search.of(p.search, p.regex, p.context)  # refused before any read

        def work(session: Session) -> t.RecallResult:
            got = engine.recall(session.id, p.handle, p.start_line, p.end_line, p.branch, search)
            return t.RecallResult(
                got.text, got.total_lines, got.start_line, got.end_line, got.truncated, got.matches
            )

        return await app.run(p.session_id, work)

    @rpc(server, m.CONTEXT_REPORT_USAGE)
    async def report_usage(ls: CompactdServer, p: t.ReportUsageParams) -> t.ReportUsageResult:
        def work(session: Session) -> t.ReportUsageResult:
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

        return await app.run(p.session_id, work)

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
