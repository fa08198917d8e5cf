"""SWE-agent trajectories (`*.traj`: one JSON document with `history`, `trajectory`, `info`).

SWE-agent (before 1.0, and with its default parser since) has no native tool calls: the model
writes a thought and one command in a fenced block, and SWE-agent answers with the command's
output as the next user message. We still map each step to a real tool call, because that is
what it is — an action with an observation — and the engine's tool rules (result aging,
clearing, budget reduction of large outputs) only apply to tool results:

* assistant message → a text block with the `thought`, then a `tool_use` named
  `"swe_agent_command"` with input `{"command": action}` and a synthetic id `swe_step_<n>`
  (n = the step's number, 1-based, so ids are deterministic);
* the user message that follows it (the observation as the model saw it, with SWE-agent's
  open-file / directory footer) → that call's `tool_result`.

The raw response is the thought followed by the fenced action, so nothing is lost. The `history`
is used when present (it is what the model actually saw: system prompt, demonstration, issue);
otherwise the `trajectory` steps are (thought, action, observation), after one meta user
message saying the prompt was not recorded (a conversation cannot open with the model), and a
warning. The system message → `ImportedSession.system`; a
demonstration message (`is_demo`) → a `"meta": True` user message. The last call (`submit`) is
never answered in the history; its output recorded in the matching trajectory step becomes its
result. SWE-agent 1.0 function-calling histories (`tool_calls` on assistant messages, `tool`
role observations with `tool_call_ids`) keep their real ids.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from ..errors import InvalidContent
from .builder import ThreadBuilder
from .jsonio import json_type, read_json_document, tool_input
from .plan import MAIN, ImportedSession, Note

COMMAND_TOOL = "swe_agent_command"
PROMPT_NOT_RECORDED = "[SWE-agent trajectory without history: the prompt was not recorded]"


def load(path: Path) -> list[ImportedSession]:
    """Import one SWE-agent trajectory file."""
    path = Path(path)
    document = read_json_document(path)
    if not isinstance(document, dict):
        raise InvalidContent(f"{path}: a .traj file holds one JSON object", path=str(path))
    history = document.get("history")
    trajectory = document.get("trajectory")
    for field, value in (("history", history), ("trajectory", trajectory)):
        if value is not None and not isinstance(value, list):
            raise InvalidContent(
                f"{path}: `{field}` must be a list of steps, got a JSON {json_type(value)}",
                path=str(path),
                field=field,
            )
    steps = [step for step in trajectory if isinstance(step, dict)] if trajectory else []
    run = _TrajectoryImport()
    if isinstance(history, list) and history:
        run.from_history([entry for entry in history if isinstance(entry, dict)], steps)
    elif steps:
        run.warnings.append("no history: rebuilt from trajectory steps; prompts not recorded")
        # A conversation cannot open with the model speaking; say plainly what is missing.
        run.builder.user(PROMPT_NOT_RECORDED, meta=True)
        run.from_steps(steps)
    else:
        raise InvalidContent(
            f"{path}: neither `history` nor `trajectory` holds any step", path=str(path)
        )
    ops = run.builder.finish()
    info = document.get("info")
    if isinstance(info, dict):
        data = {key: info[key] for key in ("exit_status", "model_stats") if key in info}
        ops.append(Note("swe_agent_info", data))
    return [
        ImportedSession(
            source_format="swe-agent",
            source_id=path.stem,
            ops=ops,
            system=run.system,
            model=_model_name(document),
            title=path.stem,
            warnings=run.warnings,
        )
    ]


class _TrajectoryImport:
    def __init__(self) -> None:
        self.warnings: list[str] = []
        self.builder = ThreadBuilder(MAIN, warn=self.warnings.append)
        self.system: str | None = None
        self.steps = 0
        self.unanswered: str | None = None  # the synthetic call waiting for its observation

    def from_history(self, history: list[dict[str, Any]], steps: list[dict[str, Any]]) -> None:
        for entry in history:
            role = entry.get("role")
            content = _text(entry.get("content"))
            if role == "system" and self.system is None:
                self.system = content
            elif role == "assistant":
                self._assistant(entry, content)
            elif role == "tool":
                for call_id in entry.get("tool_call_ids") or [entry.get("tool_call_id")]:
                    self._result(call_id, content)
            elif role in ("user", "system"):
                if role == "system":
                    self.warnings.append("a later system message became a meta user message")
                if self.unanswered is not None and not entry.get("is_demo"):
                    self._result(self.unanswered, content)
                else:
                    meta = bool(entry.get("is_demo")) or role == "system"
                    self.builder.user(content, meta=meta)
            else:
                self.warnings.append(f"skipped a history entry with role {role!r}")
        if self.unanswered is not None and len(steps) == self.steps:
            observation = steps[-1].get("observation")
            if isinstance(observation, str):
                self._result(self.unanswered, observation)

    def from_steps(self, steps: list[dict[str, Any]]) -> None:
        for step in steps:
            self._assistant(step, _text(step.get("response")))
            observation = step.get("observation")
            if self.unanswered is not None and isinstance(observation, str):
                self._result(self.unanswered, observation)

    def _assistant(self, entry: dict[str, Any], content: str) -> None:
        self.steps += 1
        thought = entry.get("thought")
        action = entry.get("action")
        blocks: list[dict[str, Any]] = []
        calls = entry.get("tool_calls")
        text = thought if isinstance(thought, str) and thought.strip() else None
        if text is None and not (isinstance(action, str) and action.strip()):
            text = content
        if text:
            blocks.append({"type": "text", "text": text})
        self.unanswered = None
        if isinstance(calls, list) and calls:
            for call in calls:
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict):
                    blocks.append(
                        {
                            "type": "tool_use",
                            "id": call.get("id"),
                            "name": function.get("name"),
                            "input": tool_input(function.get("arguments")),
                        }
                    )
        elif isinstance(action, str) and action.strip():
            call_id = f"swe_step_{self.steps}"
            blocks.append(
                {
                    "type": "tool_use",
                    "id": call_id,
                    "name": COMMAND_TOOL,
                    "input": {"command": action},
                }
            )
            self.unanswered = call_id
        self.builder.assistant(blocks)

    def _result(self, call_id: Any, content: str) -> None:
        self.builder.result({"type": "tool_result", "tool_use_id": call_id, "content": content})
        if call_id == self.unanswered:
            self.unanswered = None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # SWE-agent 1.0 content parts
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def _model_name(document: dict[str, Any]) -> str | None:
    """SWE-agent 1.0 records its config; older trajectories do not name the model."""
    config = document.get("replay_config")
    if isinstance(config, str):
        try:
            config = orjson.loads(config)
        except orjson.JSONDecodeError:
            return None
    agent = config.get("agent") if isinstance(config, dict) else None
    model = agent.get("model") if isinstance(agent, dict) else None
    name = model.get("name") if isinstance(model, dict) else None
    return name if isinstance(name, str) else None
