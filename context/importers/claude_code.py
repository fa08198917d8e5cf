"""Claude Code session JSONL (`~/.claude/projects/<project>/<session-id>.jsonl`).

Claude Code writes one line per content block while it streams, and logs tool results as they
finish, so the lines of one API message (same `message.id`) are interleaved with the results of
its parallel calls. We rebuild the API messages: assistant lines merge by `message.id`, and all
results answering one assistant message go into the user message that follows it (see
`ThreadBuilder` for the exact order).

Sub-agents become functions whose internal thread is the sub-agent's own conversation:

* newer format (2.x): `<session-id>/subagents/agent-<agentId>.jsonl` next to the session, linked
  by `toolUseResult.agentId` of the result answering the `Agent` call;
* older format (1.x): `isSidechain: true` lines inline in the session file. A sidechain is the
  chain of lines linked by `parentUuid` from a root whose `parentUuid` is null; its first user
  message is the `Task` call's `input.prompt` verbatim, which is the link (with the sub-agent's
  final text appearing in the call's result as a fallback).

Either way a call whose sub-agent transcript is found is emitted as `FunctionStart` /
sub-agent ops / `FunctionEnd` (output = the call's recorded result), and its `tool_result` block
is dropped from the main thread. One that is not found stays an ordinary tool call (warned).
Sub-agent ops are interleaved by timestamp when one message started several (they ran in
parallel); a lookup by prompt also links a sub-agent whose call never got a result.

Claude Code's own records are kept as Notes, never as conversation: `compact_boundary`
(`claude_code_compact_boundary`, data = its `compactMetadata` …), the `isCompactSummary` user
message (`claude_code_compact_summary`, data `text`, followed by a `Compaction`: the import
makes it a summary record), the compaction call itself from
`subagents/agent-acompact-*.jsonl` (`claude_code_compaction_call`, data `messages` = the call's
input messages as recorded, `summary` = the text it produced; placed just before the boundary it
led to), and older `summary` lines (`claude_code_summary`). `progress`, `file-history-snapshot`,
hook/duration `system` lines and synthetic (`<synthetic>` model) messages are skipped and
counted in `warnings`. `isMeta` user lines become `"meta": True` messages.

A result spilled to disk (`<persisted-output>` … `tool-results/<id>.txt`) is replaced by the full
file text when the file is next to the session; otherwise the preview stays and a warning says so.
A file is read for one result only: another result naming the same file keeps its preview.
Thinking blocks pass through untouched (signatures included). tool_use blocks lose only a
`caller` of `{"type": "direct"}` — Claude Code's default, which a request must not echo back.
The session file has no system prompt, so `system` is None.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from ..errors import InvalidContent, InvalidPath
from ..tokens import first_tokens
from .builder import FunctionRun, ThreadBuilder
from .files import list_inside, read_inside
from .jsonio import Records, iso_to_unix, read_jsonl, record_at
from .plan import MAIN, Compaction, ImportedSession, Note

_ANTHROPIC_USAGE_KEYS = (
    "input_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
    "output_tokens",
)
_PROGRESS_TYPE = b'"type":"progress"'
_SPILL_PATH = re.compile(r"saved to:\s*(\S+)")
_SPILL_MARK = "<persisted-output>"
_DIRECT_CALLER = {"type": "direct"}


def _read_subagent(file: Path) -> bytes:
    """A `subagents/agent-*.jsonl` file, read only inside the session's own folder."""
    session_dir = file.parent.parent
    return read_inside(session_dir.parent, session_dir.name, "subagents", file.name)


def load(path: Path) -> list[ImportedSession]:
    """Import one Claude Code session file (with its sub-agent and tool-result folders)."""
    return [_SessionImport(Path(path)).run()]


@attrs.define
class _Subagent:
    """A sub-agent conversation: a sidechain of the session file or a `subagents/` file."""

    name: str
    path: Path | None = None
    lines: list[dict[str, Any]] | None = None
    claimed: bool = False
    warn: Callable[[str], None] | None = None

    def records(self, skip: Callable[[bytes], bool]) -> list[dict[str, Any]]:
        """Its lines; a file that cannot be read inside the session's folder (more than one
        link, gone meanwhile) holds none, and says so."""
        if self.lines is None:
            assert self.path is not None
            try:
                data = _read_subagent(self.path)
            except InvalidPath as error:
                if self.warn is not None:
                    self.warn(f"sub-agent transcript {self.path.name} not read: {error.message}")
                self.lines = Records()
            else:
                self.lines = read_jsonl(self.path, skip=skip, data=data)
        return self.lines

    def prompt(self, skip: Callable[[bytes], bool]) -> str | None:
        for line in self.records(skip):
            if line.get("type") == "user":
                return _plain_text(_content_of(line))
        return None

    def final_text(self, skip: Callable[[bytes], bool]) -> str:
        for line in reversed(self.records(skip)):
            if line.get("type") == "assistant":
                return _plain_text(_content_of(line)) or ""
        return ""


class _SessionImport:
    """One session file and the folders next to it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.session_dir = path.with_suffix("")
        self.warnings: list[str] = []
        self.skipped: Counter[str] = Counter()
        self.model: str | None = None
        self.title: str | None = None
        self.subagents_by_id: dict[str, _Subagent] = {}
        self.sidechains: list[_Subagent] = []
        self.compaction_calls: list[Note] = []
        self.sent: dict[str, Any] = {}  # spilled results read back: what the model got instead
        self.spilled: dict[str, Any] = {}  # spilled file name -> the call it was read for
        self.reads = _RecentReads()  # what Claude Code re-reads after it compacts
        self.lines = Records()  # the session file's, each knowing its line

    # top level

    def run(self) -> ImportedSession:
        lines = self.lines = read_jsonl(self.path, skip=self._skip_progress)
        main_lines = [line for line in lines if not line.get("isSidechain")]
        self.sidechains = _group_sidechains([line for line in lines if line.get("isSidechain")])
        self._index_subagent_folder()
        builder = ThreadBuilder(MAIN, warn=self.warnings.append, resolve_function=self._resolve)
        self._feed(builder, main_lines, main=True)
        ops = builder.finish()
        ops.extend(self.compaction_calls)  # calls that led to no recorded boundary
        for subagent in [*self.sidechains, *self.subagents_by_id.values()]:
            if not subagent.claimed:
                self.warnings.append(f"sub-agent {subagent.name} is not linked to any tool call")
        for label, count in sorted(self.skipped.items()):
            self.warnings.append(f"skipped {count} {label} record(s)")
        source_id = next(
            (line["sessionId"] for line in lines if isinstance(line.get("sessionId"), str)),
            self.path.stem,
        )
        return ImportedSession(
            source_format="claude-code",
            source_id=source_id,
            ops=ops,
            system=None,
            model=self.model,
            title=self.title,
            warnings=self.warnings,
            sent=self.sent,
        )

    def _skip_progress(self, raw: bytes) -> bool:
        """True for a `progress` line, decided on the raw bytes (a third of a big session).

        The pattern counts only when it appears before the first nested object starts: there
        it can only be the top-level `type` key (string values cannot hold a bare `"`).
        """
        at = raw.find(_PROGRESS_TYPE)
        if at < 0:
            return False
        nested = raw.find(b'{"', 1)
        if nested >= 0 and nested < at:
            return False
        self.skipped["progress"] += 1
        return True

    def _index_subagent_folder(self) -> None:
        """The agent files of `<session>/subagents/`, listed only inside the transcript's own
        folder: a session folder or `subagents/` folder that is a symlink is not followed,
        not even to list it (a warning says so)."""
        try:
            names = list_inside(self.path.parent, self.session_dir.name, "subagents")
        except InvalidPath as error:
            self.warnings.append(f"the sub-agent folder was not read: {error.message}")
            return
        folder = self.session_dir / "subagents"
        for name in names or []:
            if not (name.startswith("agent-") and name.endswith(".jsonl")):
                continue
            file = folder / name
            if file.is_symlink() or not file.is_file():
                self.warnings.append(f"sub-agent transcript {file.name} is not a regular file")
                continue
            agent_id = file.stem.removeprefix("agent-")
            if agent_id.startswith("acompact"):
                try:
                    self.compaction_calls.append(self._compaction_call(file, agent_id))
                except InvalidPath as error:
                    self.warnings.append(f"sub-agent transcript {name} not read: {error.message}")
            else:
                subagent = _Subagent(f"agent-{agent_id}", path=file, warn=self.warnings.append)
                self.subagents_by_id[agent_id] = subagent
        self.compaction_calls.sort(key=lambda note: note.timestamp or 0.0)

    # lines → builder

    def _feed(
        self,
        builder: ThreadBuilder,
        lines: list[dict[str, Any]],
        *,
        main: bool,
        file: Path | None = None,
        numbered: Records | None = None,
    ) -> None:
        """Feed the builder one file's lines (the session's, or a `subagents/` file's), each
        read as a record of that file: what cannot be read names the line."""
        file = file or self.path
        numbered = numbered if numbered is not None else self.lines
        for line in lines:
            with record_at(file, numbered.line(line)):
                self._line(builder, line, main=main)

    def _line(self, builder: ThreadBuilder, line: dict[str, Any], *, main: bool) -> None:
        kind = line.get("type")
        timestamp = iso_to_unix(line.get("timestamp"))
        if kind == "assistant":
            self._assistant(builder, line, timestamp, main=main)
        elif kind == "user":
            self._user(builder, line, timestamp)
        elif kind == "system" and line.get("subtype") == "compact_boundary":
            self._compact_boundary(builder, line, timestamp, main=main)
        elif kind == "summary":
            summary = line.get("summary")
            if main and self.title is None and isinstance(summary, str):
                self.title = summary
            data = {"summary": summary, "leafUuid": line.get("leafUuid")}
            builder.note(Note("claude_code_summary", data, timestamp))
        elif kind == "system":
            self.skipped[f"system/{line.get('subtype')}"] += 1
        else:
            self.skipped[str(kind)] += 1

    def _assistant(
        self, builder: ThreadBuilder, line: dict[str, Any], timestamp: float | None, *, main: bool
    ) -> None:
        message = line.get("message")
        if not isinstance(message, dict):
            self.skipped["assistant without a message"] += 1
            return
        model = message.get("model")
        if model == "<synthetic>":
            self.skipped["synthetic assistant"] += 1
            return
        content = message.get("content")
        if isinstance(content, str):
            blocks = [{"type": "text", "text": content}]
        elif isinstance(content, list):
            blocks = [_clean_block(block) for block in content if isinstance(block, dict)]
        else:
            blocks = []
        if main and self.model is None and isinstance(model, str):
            self.model = model
        if main:
            self.reads.calls(blocks)
        message_id = message.get("id")
        builder.assistant(
            blocks,
            message_id=message_id if isinstance(message_id, str) else None,
            timestamp=timestamp,
            model=model if isinstance(model, str) else None,
            usage=_usage(message.get("usage")),
        )

    def _user(self, builder: ThreadBuilder, line: dict[str, Any], timestamp: float | None) -> None:
        content = _content_of(line)
        if line.get("isCompactSummary"):
            text = _plain_text(content)
            data = {"text": text, "uuid": line.get("uuid")}
            builder.note(Note("claude_code_compact_summary", data, timestamp))
            if text:  # from here on the agent sent this in place of what came before
                restored = self.reads.restored() if builder.thread is MAIN else []
                compaction = Compaction(
                    text,
                    "claude-code",
                    restored=restored,
                    thread=builder.thread,
                    timestamp=timestamp,
                )
                builder.note(compaction)
            return
        meta = bool(line.get("isMeta"))
        if isinstance(content, str):
            builder.user(content, meta=meta, timestamp=timestamp)
            return
        if not isinstance(content, list):
            self.skipped["user without content"] += 1
            return
        others = []
        for block in content:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_result":
                resolved = self._resolve_spill(block)
                if builder.thread is MAIN:
                    self.reads.result(resolved)
                builder.result(resolved, timestamp=timestamp, info=line.get("toolUseResult"))
            else:
                others.append(block)
        if others:
            builder.user(others, meta=meta, timestamp=timestamp)

    def _compact_boundary(
        self, builder: ThreadBuilder, line: dict[str, Any], timestamp: float | None, *, main: bool
    ) -> None:
        if main:
            while self.compaction_calls and (
                timestamp is None or (self.compaction_calls[0].timestamp or 0.0) <= timestamp
            ):
                builder.note(self.compaction_calls.pop(0))
        data = {
            "compactMetadata": line.get("compactMetadata"),
            "content": line.get("content"),
            "uuid": line.get("uuid"),
            "logicalParentUuid": line.get("logicalParentUuid"),
        }
        builder.note(Note("claude_code_compact_boundary", data, timestamp))

    # spilled outputs

    def _resolve_spill(self, block: dict[str, Any]) -> dict[str, Any]:
        content = block.get("content")
        if isinstance(content, str) and _SPILL_MARK in content:
            text = self._spilled_text(content, block.get("tool_use_id"))
            if text is None:
                return block
            self.sent[str(block.get("tool_use_id"))] = content
            return {**block, "content": text}
        if isinstance(content, list) and any(
            isinstance(part, dict) and _SPILL_MARK in str(part.get("text", "")) for part in content
        ):
            parts = []
            for part in content:
                text = None
                if isinstance(part, dict) and _SPILL_MARK in str(part.get("text", "")):
                    text = self._spilled_text(part["text"], block.get("tool_use_id"))
                parts.append(part if text is None else {**part, "text": text})
            if parts != content:
                self.sent[str(block.get("tool_use_id"))] = content
            return {**block, "content": parts}
        return block

    def _spilled_text(self, preview: str, call_id: Any) -> str | None:
        """The spilled file's text, read only inside `<session>/tool-results/` (the name
        comes from the transcript, which is untrusted input)."""
        match = _SPILL_PATH.search(preview)
        name = re.split(r"[\\/]", match.group(1))[-1] if match else f"{call_id}.txt"
        if name in self.spilled:  # one file per call: a second reference is crafted
            self.warnings.append(
                f"spilled output {name} of {call_id} was read for {self.spilled[name]} "
                "already; kept the preview (a file is stored once)"
            )
            return None
        self.spilled[name] = call_id
        try:
            data = read_inside(self.path.parent, self.session_dir.name, "tool-results", name)
        except (InvalidPath, InvalidContent):
            self.warnings.append(
                f"spilled output {name} of {call_id} is not a file next to the session; "
                "kept the preview"
            )
            return None
        return data.decode("utf-8", errors="replace")

    # sub-agents

    def _resolve(
        self, call: dict[str, Any], result: dict[str, Any] | None, info: Any
    ) -> FunctionRun | None:
        """Find the sub-agent a call ran, if any, and build its thread."""
        subagent = None
        agent_id = info.get("agentId") if isinstance(info, dict) else None
        if isinstance(agent_id, str):
            subagent = self.subagents_by_id.get(agent_id)
            if subagent is None:
                self.warnings.append(
                    f"sub-agent transcript agent-{agent_id}.jsonl of {call.get('id')} is "
                    "missing; kept the call as an ordinary tool call"
                )
        if subagent is None or subagent.claimed:
            subagent = self._claim_by_prompt(call) or self._claim_by_final_text(call, result)
        if subagent is None or subagent.claimed:
            return None
        subagent.claimed = True
        call_id = call["id"]
        builder = ThreadBuilder(
            call_id,
            warn=lambda message: self.warnings.append(f"sub-agent {subagent.name}: {message}"),
            resolve_function=self._resolve,
        )
        records = subagent.records(self._skip_progress)
        in_file = isinstance(records, Records)  # a subagents/ file; else the session's own
        self._feed(
            builder,
            records,
            main=False,
            file=subagent.path if in_file else None,
            numbered=records if in_file else None,
        )
        ops = builder.finish()
        return FunctionRun(ops) if ops else None

    def _claim_by_prompt(self, call: dict[str, Any]) -> _Subagent | None:
        call_input = call.get("input")
        prompt = call_input.get("prompt") if isinstance(call_input, dict) else None
        if not isinstance(prompt, str) or not prompt:
            return None
        for subagent in [*self.sidechains, *self.subagents_by_id.values()]:
            if not subagent.claimed and subagent.prompt(self._skip_progress) == prompt:
                return subagent
        return None

    def _claim_by_final_text(
        self, call: dict[str, Any], result: dict[str, Any] | None
    ) -> _Subagent | None:
        """Fallback link (older format): the sub-agent's last text is the call's answer."""
        call_input = call.get("input")
        if result is None or not isinstance(call_input, dict) or "prompt" not in call_input:
            return None
        answer = _plain_text(result.get("content"))
        if not answer:
            return None
        for subagent in self.sidechains:
            final = subagent.final_text(self._skip_progress)
            if not subagent.claimed and final and final in answer:
                return subagent
        return None

    def _compaction_call(self, file: Path, agent_id: str) -> Note:
        """Claude Code's own summary request: its input messages and the summary it produced."""
        lines = read_jsonl(file, skip=self._skip_progress, data=_read_subagent(file))
        messages: list[dict[str, Any]] = []
        last_assistant_id: str | None = None
        model = None
        usage = None
        for line in lines:
            kind = line.get("type")
            message = line.get("message")
            if kind not in ("user", "assistant") or not isinstance(message, dict):
                continue
            content = message.get("content")
            if kind == "assistant":
                model = model or message.get("model")
                usage = _usage(message.get("usage")) or usage
                blocks = (
                    content if isinstance(content, list) else [{"type": "text", "text": content}]
                )
                if (
                    messages
                    and messages[-1]["role"] == "assistant"
                    and (message.get("id") == last_assistant_id)
                ):
                    messages[-1]["content"].extend(blocks)
                    continue
                last_assistant_id = message.get("id")
                messages.append({"role": "assistant", "content": list(blocks)})
            else:
                messages.append({"role": "user", "content": content})
        response = messages.pop() if messages and messages[-1]["role"] == "assistant" else None
        data = {
            "agentId": agent_id,
            "messages": messages,
            "summary": _plain_text(response["content"]) if response else None,
            "response": response,
            "model": model,
            "usage": usage,
            "parentUuid": lines[0].get("parentUuid"),
        }
        return Note("claude_code_compaction_call", data, iso_to_unix(lines[0].get("timestamp")))


class _RecentReads:
    """The files the session read, newest last: after a compaction Claude Code re-reads the
    most recent ones into its context (at most 5, each at most 5,000 tokens), so they are
    part of what the agent saw next. A file's latest `Read` result stands for it."""

    FILES = 5
    TOKENS_EACH = 3_700  # 5,000 of Claude's tokens, in ours (Claude counts ~1.36× more)

    def __init__(self) -> None:
        self._paths: dict[str, str] = {}  # tool_use id -> file path, for Read calls
        self._latest: dict[str, str] = {}  # file path -> its latest result text

    def calls(self, blocks: list[dict[str, Any]]) -> None:
        for block in blocks:
            call_input = block.get("input")
            if block.get("type") == "tool_use" and block.get("name") == "Read":
                path = call_input.get("file_path") if isinstance(call_input, dict) else None
                if isinstance(path, str) and isinstance(block.get("id"), str):
                    self._paths[block["id"]] = path

    def result(self, block: dict[str, Any]) -> None:
        path = self._paths.get(str(block.get("tool_use_id")))
        text = _plain_text(block.get("content"))
        if path is None or not text or block.get("is_error"):
            return
        self._latest.pop(path, None)
        self._latest[path] = text  # newest last

    def restored(self) -> list[str]:
        newest = list(self._latest.items())[-self.FILES :]
        return [
            f"[{path}, re-read after the compaction]\n{first_tokens(text, self.TOKENS_EACH)}"
            for path, text in reversed(newest)
        ]


def _group_sidechains(lines: list[dict[str, Any]]) -> list[_Subagent]:
    """Split inline sidechain lines into conversations by their `parentUuid` chains."""
    chain_of: dict[str, list[dict[str, Any]]] = {}
    chains: list[list[dict[str, Any]]] = []
    previous: list[dict[str, Any]] | None = None
    for line in lines:
        parent = line.get("parentUuid")
        chain = chain_of.get(parent) if isinstance(parent, str) else None
        if chain is None:
            if parent is None or previous is None:
                chain = []
                chains.append(chain)
            else:  # its parent was a skipped line: it continues the chain written just before
                chain = previous
        chain.append(line)
        uuid = line.get("uuid")
        if isinstance(uuid, str):
            chain_of[uuid] = chain
        previous = chain
    return [_Subagent(f"sidechain {index + 1}", lines=chain) for index, chain in enumerate(chains)]


def _content_of(line: dict[str, Any]) -> Any:
    message = line.get("message")
    return message.get("content") if isinstance(message, dict) else None


def _plain_text(content: Any) -> str | None:
    """The text of a string or of the text blocks of a block list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            block["text"]
            for block in content
            if isinstance(block, dict) and isinstance(block.get("text"), str)
        )
    return None


def _clean_block(block: dict[str, Any]) -> dict[str, Any]:
    if block.get("type") == "tool_use" and block.get("caller") == _DIRECT_CALLER:
        return {key: value for key, value in block.items() if key != "caller"}
    return block


def _usage(raw: Any) -> dict[str, int] | None:
    if not isinstance(raw, dict):
        return None
    usage = {
        key: raw[key]
        for key in _ANTHROPIC_USAGE_KEYS
        if isinstance(raw.get(key), int) and not isinstance(raw.get(key), bool)
    }
    return usage or None
