"""Codex CLI rollout JSONL (`~/.codex/sessions/…/rollout-*.jsonl`).

Each line is `{timestamp, type, payload}`. What we map, in Anthropic format:

* `response_item` items of one model response (`reasoning`, assistant `message`, `function_call`,
  `custom_tool_call`, `local_shell_call`, `tool_search_call`, `web_search_call`) are consecutive
  in the log and form one assistant message; a `function_call` becomes `tool_use` with `id =
  call_id` and `input` = its parsed JSON arguments (or `{"raw": arguments}` when they are not a
  JSON object), its name prefixed by its `namespace` when it has one (an app's tool, such as
  `mcp__codex_apps__github` + `_create_issue`). The matching `*_output` item (paired by
  `call_id`) becomes a `tool_result` with the output text as the model saw it; an output object
  with `success: false` sets `is_error`. A `tool_search_call` (Codex looking up deferred tools)
  is a `tool_search` call whose result is the JSON of the tools it loaded.
* A `web_search_call` is the API's hosted search, run inside the response: it has no output item
  and its results reach the model only in its own context, so it is kept as a text block saying
  what was searched (`[web search: …]`), not as a call that would wait for a result.
* `reasoning` is encrypted, so no thinking block is invented: its readable summary is kept as a
  Note (`codex_reasoning`) just before the message it belongs to.
* User messages whose text is injected context (`<environment_context>`, `<user_instructions>`,
  AGENTS.md instructions, a `<skill>` the user named) and `developer` messages become `"meta":
  True` user messages.
* `event_msg` `token_count` → the `ModelCall` usage of the response it was reported for. Codex
  repeats the same count after every turn context; only a changed total is a new request (0.58
  wrote it before the response's items, 0.140 and later after its calls' outputs). The
  per-request `last_token_usage` is mapped by `openai_usage_to_anthropic`: `input_tokens =
  input - cached`, `cache_read_input_tokens = cached`, `cache_creation_input_tokens = 0` (OpenAI
  does not bill cache writes), `output_tokens = output` (reasoning tokens are part of it).
* `session_meta` → `source_id` and a Note; `turn_context` → the model, and a Note when it changes.
* `compacted` → a Note and a `Compaction` (the import makes it a summary record): its
  `message` is the summary, and the user messages of its `replacement_history` are carried
  over verbatim (Codex keeps the newest ones, up to 20K tokens).

Other `event_msg`s duplicate response items (user_message, agent_message, agent_reasoning,
mcp_tool_call_end, patch_apply_end, web_search_end, context_compacted) or are UI events; they and
`ghost_snapshot` items are skipped and counted in `warnings`. Older rollouts do not record the
base system prompt (newer versions write `base_instructions`, kept as the system prompt).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from .builder import ThreadBuilder
from .jsonio import (
    as_int,
    image_block,
    iso_to_unix,
    openai_usage_to_anthropic,
    read_jsonl,
    record_at,
    text_or_none,
    tool_input,
)
from .plan import MAIN, Compaction, ImportedSession, Note

_CALL_TYPES = frozenset(
    {"function_call", "custom_tool_call", "local_shell_call", "tool_search_call"}
)
_OUTPUT_TYPES = frozenset(
    {
        "function_call_output",
        "custom_tool_call_output",
        "local_shell_call_output",
        "tool_search_output",
    }
)
_INJECTED_PREFIXES = (
    "<environment_context>",
    "<user_instructions>",
    "# AGENTS.md instructions",
    "<skill>",
)


def load(path: Path) -> list[ImportedSession]:
    """Import one Codex rollout."""
    return [_RolloutImport(Path(path)).run()]


class _RolloutImport:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.warnings: list[str] = []
        self.skipped: Counter[str] = Counter()
        self.builder = ThreadBuilder(MAIN, warn=self.warnings.append)
        self.session_id: str | None = None
        self.system: str | None = None
        self.model: str | None = None
        self.turn_context: dict[str, Any] | None = None
        self.last_total: Any = None
        self.pending_usage: dict[str, int] | None = None
        self.response_open = False  # the last response item was the model's
        self.response_count = 0

    def run(self) -> ImportedSession:
        records = read_jsonl(self.path)
        for line in records:
            with record_at(self.path, records.line(line)):
                self._record(line)
        ops = self.builder.finish()
        for label, count in sorted(self.skipped.items()):
            self.warnings.append(f"skipped {count} {label} record(s)")
        return ImportedSession(
            source_format="codex",
            source_id=self.session_id or self.path.stem,
            ops=ops,
            system=self.system,
            model=self.model,
            warnings=self.warnings,
        )

    def _record(self, line: dict[str, Any]) -> None:
        payload = line.get("payload")
        kind = text_or_none(line.get("type"), "type")
        timestamp = iso_to_unix(line.get("timestamp"))
        if not isinstance(payload, dict):
            self.skipped[f"{kind} without payload"] += 1
        elif kind == "response_item":
            self._response_item(payload, timestamp)
        elif kind == "event_msg":
            self._event(payload)
        elif kind == "turn_context":
            self._turn_context(payload, timestamp)
        elif kind == "session_meta":
            self._session_meta(payload, timestamp)
        elif kind == "compacted":
            self.builder.note(Note("codex_compacted", payload, timestamp))
            compaction = _compaction(payload, timestamp)
            if compaction is not None:  # from here on Codex sent its replacement history
                self.builder.note(compaction)
        else:
            self.skipped[str(kind)] += 1

    # response items

    def _response_item(self, item: dict[str, Any], timestamp: float | None) -> None:
        kind = text_or_none(item.get("type"), "payload.type")
        role = item.get("role")
        if kind == "reasoning":
            self._model_output([], timestamp)
            summary = [
                part.get("text")
                for part in item.get("summary") or []
                if isinstance(part, dict) and isinstance(part.get("text"), str)
            ]
            data = {"summary": summary, "encrypted": bool(item.get("encrypted_content"))}
            self.builder.note_before_message(Note("codex_reasoning", data, timestamp))
        elif kind in _CALL_TYPES:
            self._model_output([self._tool_use(item)], timestamp)
        elif kind == "web_search_call":
            self._model_output([{"type": "text", "text": _web_search_text(item)}], timestamp)
        elif kind == "message" and role == "assistant":
            self._model_output(_blocks(item.get("content")), timestamp)
        elif kind == "message" and role in ("user", "developer", "system"):
            self.response_open = False
            blocks = _blocks(item.get("content"))
            meta = role != "user" or _is_injected(blocks)
            self.builder.user(blocks, meta=meta, timestamp=timestamp)
        elif kind in _OUTPUT_TYPES:
            self.response_open = False
            self.builder.result(self._tool_result(item), timestamp=timestamp)
        else:
            self.skipped[f"response_item/{kind}"] += 1

    def _model_output(self, blocks: list[dict[str, Any]], timestamp: float | None) -> None:
        """Blocks of the model's current response; the first item of a response opens it."""
        if not self.response_open:
            self.response_open = True
            self.response_count += 1
            usage, self.pending_usage = self.pending_usage, None
            self.builder.assistant(
                blocks,
                message_id=f"response-{self.response_count}",
                timestamp=timestamp,
                model=self.model,
                usage=usage,
            )
        else:
            self.builder.assistant(blocks, message_id=f"response-{self.response_count}")

    def _tool_use(self, item: dict[str, Any]) -> dict[str, Any]:
        kind = item.get("type")
        call_id = item.get("call_id") or item.get("id")
        if kind == "local_shell_call":
            action = item.get("action")
            call_input = action if isinstance(action, dict) else {"raw": action}
            name = "local_shell"
        elif kind == "tool_search_call":
            call_input = tool_input(item.get("arguments"))
            name = "tool_search"
        else:
            raw = item.get("arguments") if kind == "function_call" else item.get("input")
            call_input = tool_input(raw)
            name = str(item.get("name") or kind)
            namespace = item.get("namespace")
            if isinstance(namespace, str) and namespace:
                name = namespace + name  # an app's tool: the namespace names its server
        return {"type": "tool_use", "id": call_id, "name": name, "input": call_input}

    def _tool_result(self, item: dict[str, Any]) -> dict[str, Any]:
        output = item.get("output")
        if item.get("type") == "tool_search_output":  # the tool definitions it loaded
            output = orjson.dumps(item.get("tools")).decode()
        is_error = False
        if isinstance(output, dict):  # {content, success} in some versions
            is_error = output.get("success") is False
            output = output.get("content", "")
        content: str | list[dict[str, Any]]
        if isinstance(output, str):
            content = output
        elif isinstance(output, list):
            content = _blocks(output)
        else:
            content = "" if output is None else orjson.dumps(output).decode()
        block: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": item.get("call_id"),
            "content": content,
        }
        if is_error:
            block["is_error"] = True
        return block

    # events and context

    def _event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind != "token_count":
            self.skipped[f"event_msg/{kind}"] += 1
            return
        info = event.get("info")
        if not isinstance(info, dict):
            return
        total = info.get("total_token_usage")
        if total == self.last_total:
            return  # Codex repeats the last count after each turn context
        self.last_total = total
        last = info.get("last_token_usage")
        if not isinstance(last, dict):
            return
        usage = openai_usage_to_anthropic(
            as_int(last.get("input_tokens")),
            as_int(last.get("cached_input_tokens")),
            as_int(last.get("output_tokens")),
        )
        # Codex 0.58 wrote the count before the response's items (it belongs to the next
        # response, and the last one already has its own); since 0.140 it comes when the
        # response is done — after its calls' outputs — and belongs to the last response.
        if not self.builder.attach_usage(usage):
            self.pending_usage = usage

    def _turn_context(self, context: dict[str, Any], timestamp: float | None) -> None:
        model = context.get("model")
        if isinstance(model, str):
            self.model = self.model or model
        if context != self.turn_context:
            self.turn_context = context
            self.builder.note(Note("codex_turn_context", context, timestamp))

    def _session_meta(self, meta: dict[str, Any], timestamp: float | None) -> None:
        if isinstance(meta.get("id"), str):
            self.session_id = meta["id"]
        base = meta.get("base_instructions")
        if isinstance(base, dict) and isinstance(base.get("text"), str):
            self.system = base["text"]
        elif isinstance(base, str):
            self.system = base
        self.builder.note(Note("codex_session_meta", meta, timestamp))


ENCRYPTED_SUMMARY = (
    "[Codex compacted the conversation here; its summary is encrypted (a remote compaction) "
    "and is not in the rollout]"
)


def _compaction(payload: dict[str, Any], timestamp: float | None) -> Compaction | None:
    """A `compacted` record: `message` is the summary Codex wrote (empty for a remote one,
    whose summary is an encrypted item), `replacement_history` what it sent from then on —
    the injected context, the user's messages carried over verbatim, then the summary."""
    message = payload.get("message")
    summary = message.strip() if isinstance(message, str) else ""
    history = payload.get("replacement_history")
    requests: list[str] = []
    for item in history if isinstance(history, list) else []:
        if not isinstance(item, dict) or item.get("type") != "message":
            continue
        blocks = _blocks(item.get("content"))
        text = "\n".join(b["text"] for b in blocks if b.get("type") == "text")
        if item.get("role") != "user" or not text or _is_injected(blocks):
            continue
        if summary and summary in text:
            continue  # the summary itself, as Codex handed it to the model
        requests.append(text)
    if not summary and not requests:
        return None
    return Compaction(
        summary or ENCRYPTED_SUMMARY, "codex", user_requests=requests, timestamp=timestamp
    )


def _web_search_text(item: dict[str, Any]) -> str:
    """A hosted web search the model ran inside its response: the API answers it in the model's
    own (encrypted) context, with no output item, so what is kept is what was searched."""
    action = item.get("action")
    if not isinstance(action, dict):
        return "[web search]"
    kind = action.get("type")
    if kind == "search":
        queries = action.get("queries") or [action.get("query")]
        shown = "; ".join(str(q) for q in queries if q)
        return f"[web search: {shown}]"
    if kind == "open_page":
        return f"[web search: opened {action.get('url')}]"
    if kind == "find":
        return f"[web search: looked for {action.get('pattern')!r} in {action.get('url')}]"
    return f"[web search: {orjson.dumps(action).decode()}]"


def _blocks(content: Any) -> list[dict[str, Any]]:
    """Responses-API content parts → Anthropic blocks."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    blocks: list[dict[str, Any]] = []
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            blocks.append({"type": "text", "text": part["text"]})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            blocks.append(image_block(part["image_url"]))
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            blocks.append({"type": "text", "text": part["refusal"]})
    return blocks


def _is_injected(blocks: list[dict[str, Any]]) -> bool:
    texts = [block.get("text", "") for block in blocks if block.get("type") == "text"]
    return bool(texts) and all(text.lstrip().startswith(_INJECTED_PREFIXES) for text in texts)
