"""OpenHands evaluation output (`output.jsonl`: one run per line, `history` = event stream).

Also reads a bare event list (a JSON array of events, as OpenHands exports a trajectory).

OpenHands stores what its agent did, not the requests it sent, so we map only where the
structure is clean and say what we skipped:

* the first `system` action → `ImportedSession.system` (its tool definitions → a Note);
* a user `message` action → a user message;
* actions carrying `tool_call_metadata` come from one model response (`model_response.id`):
  the first of them emits that response as one assistant message — its text content, then
  every `tool_calls` entry as `tool_use` (id = the tool call id, input = parsed arguments) — with
  a `ModelCall` holding the response's model and usage (OpenAI counts mapped by
  `openai_usage_to_anthropic`; `prompt_tokens_details.cached_tokens` is the cached part);
* an observation with `tool_call_metadata` → the `tool_result` for its `tool_call_id`, content =
  the observation's `content` as recorded (OpenHands adds small decorations such as the exit
  code line when it formats it for the model; they are not in the record); an `error`
  observation sets `is_error`;
* an agent `message` action without metadata (a reply without tool calls) → assistant text;
* an `error` observation without metadata is feedback the model was shown (e.g. a malformed
  call whose response was not recorded) → a `"meta": True` user message.

Skipped and counted in `warnings`: `recall` actions/observations (workspace context that
OpenHands renders through its own templates), agent-state changes, and any other event.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from ..errors import InvalidContent
from .builder import ThreadBuilder
from .files import read_regular
from .jsonio import (
    as_int,
    iso_to_unix,
    json_type,
    openai_usage_to_anthropic,
    read_json_document,
    read_jsonl,
    record_at,
    tool_input,
)
from .plan import MAIN, ImportedSession, Note


def load(path: Path) -> list[ImportedSession]:
    """Import every run of an OpenHands output file (or one exported event list)."""
    path = Path(path)
    if _starts_with_array(path):
        events = read_json_document(path)
        with record_at(path, what="an event"):
            return [_import_run({"history": events}, path.stem, path)]
    sessions = []
    records = read_jsonl(path)
    for number, record in enumerate(records, start=1):
        line = records.line(record)
        if not isinstance(record.get("history"), list):
            raise InvalidContent(
                f"{path}: line {line} has no `history` event list", path=str(path), line=line
            )
        with record_at(path, line, what="a run"):
            sessions.append(_import_run(record, f"{path.stem}:{number}", path))
    return sessions


def _starts_with_array(path: Path) -> bool:
    return read_regular(path)[:4096].lstrip().startswith(b"[")


def _import_run(record: dict[str, Any], fallback_id: str, path: Path) -> ImportedSession:
    run = _RunImport()
    for event in record["history"]:
        if isinstance(event, dict):
            run.event(event)
        else:
            run.skipped["non-object event"] += 1
    ops = run.builder.finish()
    if record.get("error"):
        ops.append(Note("openhands_error", {"error": record["error"]}))
    for label, count in sorted(run.skipped.items()):
        run.warnings.append(f"skipped {count} {label} event(s)")
    instance_id = record.get("instance_id")
    metadata = record.get("metadata")
    llm_config = metadata.get("llm_config") if isinstance(metadata, dict) else None
    configured_model = llm_config.get("model") if isinstance(llm_config, dict) else None
    return ImportedSession(
        source_format="openhands",
        source_id=str(instance_id) if instance_id else fallback_id,
        ops=ops,
        system=run.system,
        model=configured_model if isinstance(configured_model, str) else run.model,
        title=str(instance_id) if instance_id else None,
        warnings=run.warnings,
    )


class _RunImport:
    def __init__(self) -> None:
        self.warnings: list[str] = []
        self.skipped: Counter[str] = Counter()
        self.builder = ThreadBuilder(MAIN, warn=self.warnings.append)
        self.system: str | None = None
        self.model: str | None = None
        self.responses_seen: set[str] = set()

    def event(self, event: dict[str, Any]) -> None:
        timestamp = iso_to_unix(event.get("timestamp"))
        action = event.get("action")
        observation = event.get("observation")
        metadata = event.get("tool_call_metadata")
        args = event.get("args") if isinstance(event.get("args"), dict) else {}
        if action == "system" and self.system is None:
            self.system = _text(args.get("content")) or _text(event.get("message"))
            if args.get("tools") is not None:
                data = {
                    "tools": args.get("tools"),
                    "openhands_version": args.get("openhands_version"),
                }
                self.builder.note(Note("openhands_tools", data, timestamp))
        elif action is not None and isinstance(metadata, dict):
            self._model_response(metadata, event.get("id"), timestamp)
        elif action == "message" and event.get("source") == "user":
            text = _text(args.get("content")) or _text(event.get("message")) or ""
            self.builder.user(text, timestamp=timestamp)
            if args.get("image_urls"):
                self.warnings.append("dropped image_urls of a user message (not recorded inline)")
        elif action == "message" and event.get("source") == "agent":
            text = _text(args.get("content")) or _text(event.get("message")) or ""
            self.builder.assistant([{"type": "text", "text": text}], timestamp=timestamp)
        elif observation is not None and isinstance(metadata, dict):
            self._tool_result(event, metadata, timestamp)
        elif observation == "error":
            self.builder.user(_text(event.get("content")) or "", meta=True, timestamp=timestamp)
            self.warnings.append(
                "an error observation without a tool call became a meta user message"
            )
        elif action is not None:
            self.skipped[f"{action} action"] += 1
        elif observation is not None:
            self.skipped[f"{observation} observation"] += 1
        else:
            self.skipped["unknown"] += 1

    def _model_response(
        self, metadata: dict[str, Any], event_id: Any, timestamp: float | None
    ) -> None:
        response = metadata.get("model_response")
        if not isinstance(response, dict):
            self.skipped["tool action without its model response"] += 1
            return
        # Without a response id, each action stands for its own response.
        response_id = str(response.get("id") or f"event {event_id}")
        if response_id in self.responses_seen:
            return  # a later action of the same response (parallel tool calls)
        self.responses_seen.add(response_id)
        choices = response.get("choices") or [{}]
        if not isinstance(choices, list):
            raise InvalidContent(
                f"`model_response.choices` must be a list, got a JSON {json_type(choices)}",
                field="model_response.choices",
            )
        message = choices[0].get("message") if isinstance(choices[0], dict) else None
        message = message if isinstance(message, dict) else {}
        blocks: list[dict[str, Any]] = []
        text = _text(message.get("content"))
        if text:
            blocks.append({"type": "text", "text": text})
        calls = message.get("tool_calls") or []
        for call in calls if isinstance(calls, list) else []:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict):
                continue
            blocks.append(
                {
                    "type": "tool_use",
                    "id": call.get("id"),
                    "name": function.get("name"),
                    "input": tool_input(function.get("arguments")),
                }
            )
        model = response.get("model") if isinstance(response.get("model"), str) else None
        self.model = self.model or model
        self.builder.assistant(
            blocks,
            message_id=f"response:{response_id}",
            timestamp=timestamp,
            model=model,
            usage=_usage(response.get("usage")),
        )

    def _tool_result(
        self, event: dict[str, Any], metadata: dict[str, Any], timestamp: float | None
    ) -> None:
        block: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": metadata.get("tool_call_id"),
            "content": _text(event.get("content")) or "",
        }
        if event.get("observation") == "error":
            block["is_error"] = True
        self.builder.result(block, timestamp=timestamp)


def _usage(raw: Any) -> dict[str, int] | None:
    if not isinstance(raw, dict):
        return None
    details = raw.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if not isinstance(cached, int):
        cached = raw.get("cache_read_input_tokens")
    written = raw.get("cache_creation_input_tokens")
    return openai_usage_to_anthropic(
        as_int(raw.get("prompt_tokens")),
        as_int(cached),
        as_int(raw.get("completion_tokens")),
        as_int(written),
    )


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts
        return "".join(part.get("text", "") for part in value if isinstance(part, dict)) or None
    return None
