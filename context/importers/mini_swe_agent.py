"""mini-swe-agent trajectories (`*.traj.json`: `{"info", "messages", "trajectory_format"}`).

`messages` is the conversation as the model saw it, in OpenAI's shape: the system prompt, the
task, then assistant messages and the environment's answers. Two styles:

* tool calling (mini-swe-agent 2): assistant `tool_calls` (a `bash` command each) answered by
  `tool` messages — real calls, paired by id;
* text actions (mini-swe-agent 1): the assistant writes one command in a fenced block
  (```` ```bash ```` or ```` ```mswea_bash_command ````) and the next user message is its
  output. As for SWE-agent, each such step becomes a call (`mini_swe_agent_command`, id
  `mswea_step_<n>`) and its output the result, so the tool rules (Budget Reduction, clearing)
  apply to observations.

The final `exit` message (the submission) is a Note; `info` gives the model (`config.model.
model_name`) and a Note with the exit status and cost. An assistant message's
`extra.response.usage` (`prompt_tokens`, `completion_tokens`, `prompt_tokens_details.
cached_tokens`) is its request's usage.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import InvalidContent
from .builder import ThreadBuilder
from .chat import ChatFeed, text_of
from .jsonio import as_int, openai_usage_to_anthropic, read_json_document
from .plan import MAIN, ImportedSession, Note

COMMAND_TOOL = "mini_swe_agent_command"
_ACTION = re.compile(r"```(?:mswea_bash_command|bash)\s*\n(.*?)\n```", re.S)


def load(path: Path) -> list[ImportedSession]:
    """Import one mini-swe-agent trajectory."""
    path = Path(path)
    document = read_json_document(path)
    messages = document.get("messages") if isinstance(document, dict) else None
    if not isinstance(messages, list):
        raise InvalidContent(
            f"{path}: a mini-swe-agent trajectory holds `messages`", path=str(path)
        )
    info = document.get("info") if isinstance(document.get("info"), dict) else {}
    warnings: list[str] = []
    builder = ThreadBuilder(MAIN, warn=warnings.append)
    feed = ChatFeed(builder, warnings.append)
    model = _model(info)
    waiting: str | None = None  # a text action's synthetic call, until its output comes
    steps = 0
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role == "exit":
            builder.note(Note("mini_swe_agent_exit", {"content": message.get("content")}))
            continue
        if role == "user" and waiting is not None:
            result = {
                "type": "tool_result",
                "tool_use_id": waiting,
                "content": text_of(message.get("content")),
            }
            builder.result(result)
            waiting = None
            continue
        usage = _usage(message.get("extra"))
        if role == "assistant" and not message.get("tool_calls"):
            action = _ACTION.search(text_of(message.get("content")))
            if action:
                steps += 1
                waiting = f"mswea_step_{steps}"
                call = {
                    "id": waiting,
                    "function": {"name": COMMAND_TOOL, "arguments": {"command": action.group(1)}},
                }
                message = {**message, "tool_calls": [call]}
        feed.message(message, usage=usage, model=model)
    data = {key: info[key] for key in ("exit_status", "model_stats", "mini_version") if key in info}
    if data:
        builder.note(Note("mini_swe_agent_info", data))
    instance = document.get("instance_id")
    return [
        ImportedSession(
            source_format="mini-swe-agent",
            source_id=instance
            if isinstance(instance, str)
            else path.name.removesuffix(".traj.json"),
            ops=builder.finish(),
            system=feed.system,
            model=model,
            title=instance if isinstance(instance, str) else path.stem,
            warnings=warnings,
        )
    ]


def _model(info: dict[str, Any]) -> str | None:
    config = info.get("config")
    model = config.get("model") if isinstance(config, dict) else None
    name = model.get("model_name") if isinstance(model, dict) else None
    return name if isinstance(name, str) else None


def _usage(extra: Any) -> dict[str, int] | None:
    response = extra.get("response") if isinstance(extra, dict) else None
    usage = response.get("usage") if isinstance(response, dict) else None
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else 0
    return openai_usage_to_anthropic(
        as_int(usage.get("prompt_tokens")), as_int(cached), as_int(usage.get("completion_tokens"))
    )
