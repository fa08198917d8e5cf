"""The Python async client: spawn `compactd serve` (or attach to given streams) and call it.

A small JSON-RPC 2.0 peer over LSP framing, written here rather than on pygls' client so a
client pulls in neither pygls nor the engine (only `compactd.protocol`), starts fast, and
puts a timeout on every call (a timed-out or cancelled call sends `$/cancelRequest`). Typed
methods take keyword arguments — attrs types of `compactd.protocol.types` or plain dicts —
and return those attrs types; notifications arrive as callbacks or through an async iterator;
`context/summarize` requests from the daemon go to a handler you register.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Literal, TypeVar

import attrs
import orjson

from ..protocol import methods as m
from ..protocol import types as t
from ..protocol.convert import camel, structure, unstructure
from ..protocol.recall import page_text
from .errors import RpcError

R = TypeVar("R")
Json = dict[str, Any]
Handler = Callable[[dict[str, Any]], Any]
DEFAULT_TIMEOUT = 120.0
UNSET: Any = object()


class AnsweredDespiteCancel(asyncio.CancelledError):
    """A cancelled call the daemon had finished before the cancel reached it (`result`, its
    raw answer, says what was done). Still a cancellation: raised only with `cancel_wait`."""

    def __init__(self, method: str, result: Any) -> None:
        super().__init__(f"{method} finished before it was cancelled")
        self.method = method
        self.result = result


class CompactdClient:
    cancel_wait: float = 0.0
    """Seconds a cancelled call waits for the daemon's answer (0: none; the CLI waits, so it
    exits only once the daemon has stopped the work)."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        process: asyncio.subprocess.Process | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.process = process
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._pending: dict[Any, asyncio.Future[Any]] = {}
        self._listeners: dict[str, list[Handler]] = {}
        self._request_handlers: dict[str, Callable[[dict[str, Any]], Awaitable[Any] | Any]] = {}
        self._queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self._tasks: dict[Any, asyncio.Task[Any]] = {}  # daemon requests being answered
        self._closed = False
        self._gone: ConnectionError | None = None  # why calls fail once the daemon is gone
        self._reader_task = asyncio.ensure_future(self._read_loop())

    # ---- starting ----------------------------------------------------------------------------

    @classmethod
    async def spawn(
        cls,
        command: Sequence[str] | None = None,
        *,
        data_dir: str | None = None,
        env: dict[str, str] | None = None,
        args: Sequence[str] = (),
        timeout: float = DEFAULT_TIMEOUT,
        stderr: Any = None,
        new_process_group: bool = False,
    ) -> CompactdClient:
        """Start a daemon (`python -m compactd serve` by default) and connect to it.
        `new_process_group`: Ctrl-C in a terminal reaches only the caller, which then closes
        the daemon cleanly (the CLI), instead of killing both mid-write."""
        cmd = list(command) if command else [sys.executable, "-m", "compactd"]
        if data_dir is not None:
            cmd += ["--data-dir", str(data_dir)]
        cmd += ["serve", *args]
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            env={**os.environ, **(env or {})},
            limit=2**24,
            start_new_session=new_process_group,
        )
        assert proc.stdout is not None and proc.stdin is not None
        return cls(proc.stdout, proc.stdin, proc, timeout)

    @classmethod
    def attach(
        cls,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> CompactdClient:
        return cls(reader, writer, None, timeout)

    async def __aenter__(self) -> CompactdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- the wire ------------------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        body = orjson.dumps(message)
        self.writer.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)

    async def _read_loop(self) -> None:
        try:
            while True:
                length = None
                while True:
                    line = await self.reader.readline()
                    if not line:
                        return
                    if line in (b"\r\n", b"\n"):
                        break
                    name, _, value = line.decode("latin-1").partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                if length is None:
                    continue
                body = await self.reader.readexactly(length)
                self._dispatch(orjson.loads(body))
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            self._gone = await self._closed_error()
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(self._gone)

    async def _closed_error(self) -> ConnectionError:
        """What a call gets once the daemon is gone: said at once, with its exit code when
        it is ours (it has exited, or does within a moment of closing its output)."""
        code = None
        if self.process is not None:
            with contextlib.suppress(TimeoutError):
                code = await asyncio.wait_for(self.process.wait(), 1.0)
        said = "" if code is None else f" (exit code {code})"
        return ConnectionError(f"the daemon closed the connection{said}")

    def _dispatch(self, msg: dict[str, Any]) -> None:
        if "method" in msg and "id" in msg:  # a request from the daemon
            task = asyncio.ensure_future(self._answer(msg))
            self._tasks[msg["id"]] = task
            task.add_done_callback(lambda _t, i=msg["id"]: self._tasks.pop(i, None))
        elif msg.get("method") == "$/cancelRequest":  # the daemon no longer needs an answer
            task = self._tasks.get((msg.get("params") or {}).get("id"))
            if task is not None:
                task.cancel()
        elif "method" in msg:
            params = msg.get("params") or {}
            for listener in self._listeners.get(msg["method"], []):
                listener(params)
            self._queue.put_nowait((msg["method"], params))
        else:
            fut = self._pending.pop(msg.get("id"), None)
            if fut is None or fut.done():
                return
            if "error" in msg and msg["error"] is not None:
                err = msg["error"]
                fut.set_exception(
                    RpcError(err.get("code", 0), err.get("message", ""), err.get("data"))
                )
            else:
                fut.set_result(msg.get("result"))

    async def _answer(self, msg: dict[str, Any]) -> None:
        handler = self._request_handlers.get(msg["method"])
        if handler is None:
            self._send(
                {
                    "jsonrpc": "2.0",
                    "id": msg["id"],
                    "error": {"code": -32601, "message": f"no handler for {msg['method']}"},
                }
            )
            return
        try:
            result = handler(msg.get("params") or {})
            if asyncio.iscoroutine(result):
                result = await result
            payload = unstructure(result) if attrs.has(type(result)) else result
            self._send({"jsonrpc": "2.0", "id": msg["id"], "result": payload})
        except asyncio.CancelledError:
            self._send(
                {
                    "jsonrpc": "2.0",
                    "id": msg["id"],
                    "error": {"code": -32800, "message": "cancelled by the daemon"},
                }
            )
        except Exception as exc:
            self._send(
                {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32603, "message": str(exc)}}
            )

    # ---- generic calls ------------------------------------------------------------------------

    def send_request(self, method: str, params: Any = None) -> tuple[int, asyncio.Future[Any]]:
        """Send without waiting; returns the id (for `cancel`) and the future of the answer."""
        msg_id = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self._reader_task.done():  # the daemon is gone: fail now, not at the timeout
            fut.set_exception(self._gone or ConnectionError("the daemon closed the connection"))
            fut.exception()  # retrieved here if nobody awaits it: no "never retrieved" noise
            return msg_id, fut
        self._pending[msg_id] = fut
        payload = unstructure(params) if attrs.has(type(params)) else params
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if payload is not None:
            message["params"] = payload
        self._send(message)
        return msg_id, fut

    async def request(self, method: str, params: Any = None, timeout: float | None = None) -> Any:
        """Send and wait. A timeout or a cancelled task tells the daemon (`$/cancelRequest`),
        so it stops work nobody will read; with `cancel_wait`, a cancelled call then waits
        that long for the daemon's answer (it comes once the work has stopped)."""
        msg_id, fut = self.send_request(method, params)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout or self.timeout)
        except TimeoutError:
            self._give_up(msg_id, fut)
            raise
        except asyncio.CancelledError:
            if not fut.done():
                with contextlib.suppress(Exception):
                    self.cancel(msg_id)
                if self.cancel_wait:
                    await asyncio.wait({fut}, timeout=self.cancel_wait)
            self._give_up(msg_id, fut, told=True)
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                raise AnsweredDespiteCancel(method, fut.result()) from None
            raise

    def _give_up(self, msg_id: int, fut: asyncio.Future[Any], told: bool = False) -> None:
        """Stop waiting for an answer (and, unless `told` already, tell the daemon)."""
        self._pending.pop(msg_id, None)
        if not fut.done():
            fut.cancel()
            if not told:
                with contextlib.suppress(Exception):
                    self.cancel(msg_id)

    def notify(self, method: str, params: Any = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = unstructure(params) if attrs.has(type(params)) else params
        self._send(message)

    def cancel(self, msg_id: int) -> None:
        self.notify("$/cancelRequest", {"id": msg_id})

    async def call(self, method: str, params: Any, result_type: type[R]) -> R:
        raw = await self.request(method, params)
        if result_type is dict:
            return raw  # type: ignore[no-any-return]
        return structure(raw, result_type, method, check_depth=False)

    # ---- notifications and daemon requests ----------------------------------------------------

    def on_notification(self, method: str, callback: Handler) -> None:
        self._listeners.setdefault(method, []).append(callback)

    async def notifications(self) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        while True:
            yield await self._queue.get()

    async def next_notification(self, method: str, timeout: float = 10.0) -> dict[str, Any]:
        async def wait() -> dict[str, Any]:
            while True:
                name, params = await self._queue.get()
                if name == method:
                    return params

        return await asyncio.wait_for(wait(), timeout)

    def on_summarize(
        self,
        handler: Callable[[t.SummarizeParams], Awaitable[t.SummarizeResult] | t.SummarizeResult],
    ) -> None:
        """Be the `client` summary provider: answer the daemon's `context/summarize`."""

        def adapt(raw: dict[str, Any]) -> Any:
            return handler(structure(raw, t.SummarizeParams, m.REQUEST_SUMMARIZE))

        self._request_handlers[m.REQUEST_SUMMARIZE] = adapt

    # ---- typed methods (DESIGN §6) ----------------------------------------------------------

    async def open_session(
        self, session_id: str | None = None, config: dict[str, Any] | None = None
    ) -> t.OpenResult:
        return await self.call(m.SESSION_OPEN, t.OpenParams(session_id, config), t.OpenResult)

    async def list_sessions(self, prefix: str | None = None) -> t.ListResult:
        """Sessions, newest first; with `prefix`, only those whose id starts with it."""
        return await self.call(m.SESSION_LIST, wire_params(t.ListParams, locals()), t.ListResult)

    async def get(
        self, session_id: str, node_id: str | None = None, branch: str | None = None
    ) -> dict[str, Any]:
        return await self.call(m.SESSION_GET, t.GetParams(session_id, branch, node_id), dict)

    async def append(
        self,
        session_id: str,
        messages: list[dict[str, Any]] | None = None,
        *,
        nodes: list[dict[str, Any]] | None = None,
        format: str = "anthropic",
        branch: str | None = None,
        function_id: str | None = None,
        expected_head: Any = UNSET,
    ) -> t.AppendResult:
        """Append messages; `expected_head` (None: an empty thread) guards against other
        writers moving the thread first. A message may be the anthropic SDK's reply itself
        (`Message` / `BetaMessage`): its role and content are appended."""
        params = unstructure(
            t.AppendParams(
                session_id,
                None if messages is None else [as_message(msg) for msg in messages],
                nodes,
                format,  # type: ignore[arg-type]
                branch,
                function_id,
            )
        )
        if expected_head is not UNSET:
            params["expectedHead"] = expected_head
        return await self.call(m.SESSION_APPEND, params, t.AppendResult)

    async def import_transcript(
        self, path: str, *, new: bool = False, work_done_token: str | None = None
    ) -> t.ImportResult:
        """Import a transcript; one imported before from the same file is returned (its id
        also in `existing`) unless `new`."""
        params = t.ImportParams(str(path), new, work_done_token)
        return await self.call(m.SESSION_IMPORT, params, t.ImportResult)

    async def tool_result(
        self, session_id: str, tool_use_id: str, content: Any, is_error: bool = False
    ) -> t.HeadResult:
        return await self.call(
            m.SESSION_TOOL_RESULT,
            t.ToolResultParams(session_id, tool_use_id, content, is_error),
            t.HeadResult,
        )

    async def function_start(
        self,
        session_id: str,
        name: str,
        input: Any = None,
        *,
        tool_use_id: str | None = None,
        parent: str | None = None,
        expose: t.Expose = "io",
        branch: str | None = None,
        function_id: str | None = None,
    ) -> t.FunctionStartResult:
        params = wire_params(t.FunctionStartParams, locals())
        return await self.call(m.FUNCTION_START, params, t.FunctionStartResult)

    async def function_complete(
        self, session_id: str, function_id: str, output: Any = "", status: str = "completed"
    ) -> t.HeadResult:
        return await self.call(
            m.FUNCTION_COMPLETE,
            t.FunctionCompleteParams(session_id, function_id, output, status),  # type: ignore[arg-type]
            t.HeadResult,
        )

    async def branch(
        self, session_id: str, name: str, from_node: str | None = None
    ) -> t.BranchResult:
        return await self.call(
            m.SESSION_BRANCH, t.BranchParams(session_id, name, from_node), t.BranchResult
        )

    async def checkout(self, session_id: str, branch: str) -> t.BranchResult:
        return await self.call(
            m.SESSION_CHECKOUT, t.CheckoutParams(session_id, branch), t.BranchResult
        )

    async def render(
        self,
        session_id: str,
        *,
        branch: str | None = None,
        model: str | None = None,
        window: int | None = None,
        max_output_tokens: int | None = None,
        system: str | list[Json] | None = None,
        tools: list[Json] | None = None,
        response_schema: Json | None = None,
        format: t.Format = "anthropic",
        cascade: bool = False,
        dry_run: bool = False,
        cache: bool = True,
        cache_ttl: Literal["5m", "1h"] | None = None,
        overflow: t.ProviderError | Json | None = None,
        viewer: str | None = None,
        callers: bool = False,
        subcalls: bool = False,
        expose: t.Expose | None = None,
        work_done_token: str | None = None,
        recall: bool | None = None,
        fallback_models: list[str] | None = None,
    ) -> t.RenderResult:
        """The next request (`request`, sent with `headers`), its size (`tokens`) and what the
        cascade did (`events`); `overflow` is the provider's prompt-too-long error, to run
        Tier 5; `fallback_models`: the request must fit each of them too; `dry_run`: a
        preview that writes nothing."""
        params = wire_params(t.RenderParams, locals())
        return await self.call(m.CONTEXT_RENDER, params, t.RenderResult)

    async def measure(
        self,
        session_id: str,
        *,
        branch: str | None = None,
        model: str | None = None,
        window: int | None = None,
        max_output_tokens: int | None = None,
        system: str | list[Json] | None = None,
        tools: list[Json] | None = None,
        format: t.Format = "anthropic",
        viewer: str | None = None,
        recall: bool | None = None,
        fallback_models: list[str] | None = None,
    ) -> t.MeasureResult:
        """Tokens by category (the context panel), without changing anything."""
        params = wire_params(t.RenderParams, locals())
        return await self.call(m.CONTEXT_MEASURE, params, t.MeasureResult)

    async def compact(
        self,
        session_id: str,
        instructions: str | None = None,
        *,
        branch: str | None = None,
        model: str | None = None,
        window: int | None = None,
        max_output_tokens: int | None = None,
        system: str | list[Json] | None = None,
        tools: list[Json] | None = None,
        format: t.Format = "anthropic",
        work_done_token: str | None = None,
        timeout: float | None = None,
    ) -> t.CompactResult:
        """/compact: summarize now (Tier 4), shaped by `instructions`."""
        args = dict(locals())
        del args["timeout"]
        raw = await self.request(
            m.CONTEXT_COMPACT, wire_params(t.CompactParams, args), timeout=timeout
        )
        return structure(raw, t.CompactResult, m.CONTEXT_COMPACT, check_depth=False)

    async def snip(
        self,
        session_id: str,
        target_tokens: int | None = None,
        *,
        branch: str | None = None,
        model: str | None = None,
        window: int | None = None,
        max_output_tokens: int | None = None,
        system: str | list[Json] | None = None,
        tools: list[Json] | None = None,
        format: t.Format = "anthropic",
    ) -> t.SnipResult:
        params = wire_params(t.SnipParams, locals())
        return await self.call(m.CONTEXT_SNIP, params, t.SnipResult)

    async def uncollapse(self, session_id: str, collapse_id: str) -> t.UncollapseResult:
        return await self.call(
            m.CONTEXT_UNCOLLAPSE, t.UncollapseParams(session_id, collapse_id), t.UncollapseResult
        )

    async def recall(
        self,
        session_id: str,
        handle: str,
        start_line: int | None = None,
        end_line: int | None = None,
        branch: str | None = None,
        search: str | None = None,
        regex: bool | None = None,
        context: int | None = None,
    ) -> t.RecallResult:
        """A page of what `handle` stands for — or, with `search`, the lines of it that
        match (plain text; `regex`: an RE2 regular expression), `context` lines around each."""
        params = wire_params(t.RecallParams, locals())
        return await self.call(m.CONTEXT_RECALL, params, t.RecallResult)

    async def answer_recall(self, session_id: str, tool_use: dict[str, Any]) -> dict[str, Any]:
        """The `tool_result` block answering the model's `compactd_recall` call: the recalled
        lines or a search's matches, with a note on how to continue when they were cut. A bad
        handle, line or search is the model's mistake, so it comes back as an error result
        the model can read."""
        tool_use = plain(tool_use)
        inp = tool_use.get("input") or {}
        try:
            got = await self.recall(
                session_id,
                str(inp.get("handle", "")),
                inp.get("startLine"),
                inp.get("endLine"),
                search=inp.get("search"),
                regex=inp.get("regex"),
                context=inp.get("context"),
            )
        except RpcError as err:
            return {
                "type": "tool_result",
                "tool_use_id": tool_use["id"],
                "content": err.message,
                "is_error": True,
            }
        return {"type": "tool_result", "tool_use_id": tool_use["id"], "content": recall_text(got)}

    async def report_usage(
        self,
        session_id: str,
        model: str,
        *,
        usage: Json | None = None,
        error: t.ProviderError | Json | None = None,
        applied_edits: list[Json] | None = None,
        branch: str | None = None,
    ) -> t.ReportUsageResult:
        """What the provider said about the last request: its `usage`, or its `error`
        (`{"status": 400, "message": "prompt is too long…"}` or a `ProviderError`)."""
        params = wire_params(t.ReportUsageParams, locals())
        return await self.call(m.CONTEXT_REPORT_USAGE, params, t.ReportUsageResult)

    async def replay(
        self,
        path: str,
        *,
        window: int | None = None,
        reserve: int | None = None,
        ttl: Literal["5m", "1h"] = "5m",
        summary_provider: Literal["anthropic", "client", "digest"] | None = None,
        config: Json | None = None,
        baseline: bool = True,
        index: int = 0,
        model: str | None = None,
        system_tokens: int | None = None,
        ratio: float | None = None,
        write_price: float | None = None,
        work_done_token: str | None = None,
        timeout: float = 3600.0,
    ) -> dict[str, Any]:
        """Replay a transcript in a scratch store, priced; the report as the daemon wrote it."""
        args = dict(locals())
        del args["timeout"]
        params = wire_params(t.ReplayParams, args)
        result: dict[str, Any] = await self.request(m.SESSION_REPLAY, params, timeout=timeout)
        return result

    async def status(self) -> t.StatusResult:
        return await self.call(m.DAEMON_STATUS, {}, t.StatusResult)

    # ---- ending --------------------------------------------------------------------------------

    async def close(self, timeout: float = 10.0) -> int | None:
        """`shutdown` then `exit`; returns the daemon's exit code when we spawned it."""
        if self._closed:
            return self.process.returncode if self.process else None
        self._closed = True
        if not self._reader_task.done():  # the daemon is still there to answer
            with contextlib.suppress(Exception):
                await self.request("shutdown", None, timeout=timeout)
        with contextlib.suppress(Exception):
            self.notify("exit")
            await self.writer.drain()
        code = None
        if self.process is not None:
            try:
                code = await asyncio.wait_for(self.process.wait(), timeout)
            except TimeoutError:
                self.process.kill()
                code = await self.process.wait()
        self._reader_task.cancel()
        with contextlib.suppress(BaseException):
            await self._reader_task
        return code


def wire_params(cls: type[R], args: dict[str, Any]) -> R:
    """A method's keyword arguments as its params type: plain dicts are accepted wherever a
    wire type is (`error={"status": 400, …}`), and a wrong type fails here, naming the field,
    before anything is sent."""
    names = {a.name for a in attrs.fields(cls)}  # type: ignore[arg-type]
    raw = {
        camel(k): unstructure(v) if attrs.has(type(v)) else plain(v)
        for k, v in args.items()
        if k in names and v is not None
    }
    return structure(raw, cls, cls.__name__)


def plain(value: Any) -> Any:
    """An SDK object (a pydantic model: the anthropic SDK's usage, edits, blocks) as the JSON
    it stands for, its unset fields left out; dicts and lists are walked, the rest kept."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        return dump(mode="json", exclude_none=True)
    return value


_DIRECT_CALLER = {"type": "direct"}


def as_message(message: Any) -> Any:
    """A message to append: a dict as given (SDK blocks in it made plain), or a model's reply
    (the SDK's `Message` / `BetaMessage`, or its JSON) as the assistant message it holds —
    its role and content only, and without the `caller: {"type": "direct"}` the API adds to
    each tool_use block (the default, which a request does not echo back)."""
    data = plain(message)
    if not isinstance(data, dict) or data.get("type") != "message":
        return data
    content = [
        {k: v for k, v in block.items() if not (k == "caller" and v == _DIRECT_CALLER)}
        if isinstance(block, dict) and block.get("type") == "tool_use"
        else block
        for block in data.get("content") or []
    ]
    return {"role": data.get("role", "assistant"), "content": content}


def tool_uses(reply: Any) -> list[dict[str, Any]]:
    """The `tool_use` blocks of a model's reply (an SDK message or a message dict), as dicts:
    the calls the agent answers (`call["name"]`, `call["input"]`, `call["id"]`)."""
    content = as_message(reply).get("content") if reply is not None else None
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]


def recall_text(got: t.RecallResult) -> str:
    """A recalled page as the model reads it; a cut page (or search) says where to continue."""
    return page_text(
        got.text, got.start_line, got.end_line, got.total_lines, got.truncated, got.matches
    )
