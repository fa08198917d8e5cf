"""A scripted model for driving real agent CLIs (Claude Code) against the fake Messages API.

The fake answers an agent's main-loop request (one that offers the `Bash` tool) the way a model
working through a long task would: a thinking block and one `Bash` call per step, each printing
a large output, until `steps` calls are done, then a final text. What step comes next is read
from the request alone — the last message's tool_result id names the step it answers — so the
script needs no memory of earlier requests and holds however the client (or compactd) shortened
the history before it. A new user prompt starts a new run of steps, so `--resume` with a second
prompt works the same way.

Any other request (a title, a summary, compactd's own summarizer) gets a short text; requests
that look like the agent's own compaction (Claude Code's summary prompt) are recognised by
`is_agent_summary` so a test can assert there were none. compactd's summary asked as a fork of
the agent's request (the agent's tools and history, then compactd's instruction) is answered
as a model would, with a checkpoint (`is_compactd_fork`).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

STEP_ID = re.compile(r"^toolu_(?P<run>[0-9a-f]{8})_(?P<step>\d{4})$")
AGENT_SUMMARY_MARKERS = (
    "create a detailed summary of the conversation",  # Claude Code's compaction prompt
    "CONTEXT CHECKPOINT COMPACTION",  # Codex's
    "generate the updated <state_snapshot>",  # Gemini CLI's
    "produce the <state_snapshot> XML",  # Qwen Code's
    "Create a new anchored summary",  # opencode's (its first)
    "Construct a new summary that combines both",  # opencode's (after a summary)
    "summarize this partial conversation about programming",  # aider's (its system prompt)
)
AGENT_CLEARING_MARKERS = (
    "[Old tool result content cleared]",  # Qwen Code's and opencode's own clearing
    "[Tool output truncated for compaction",  # opencode's
)
PROGRESS = re.compile(r"\[progress run=(?P<run>[0-9a-f]{8}) step=(?P<step>\d{4})\]")
"""What the scripted model writes into a summary, so that after an agent compacts its own
history the model carries on where it was, as a real one would from the summary."""


SIGNING_KEY = "scripted-model-signing-key"


def thinking_signature(thinking: str) -> str:
    """The signature the scripted model gives a thinking block: a strict upstream verifies
    that a block comes back with exactly the text it was signed for (`verify_signatures`)."""
    return hashlib.sha256(f"{SIGNING_KEY}:{thinking}".encode()).hexdigest()


def progress_tag(run: str, step: int) -> str:
    return f"[progress run={run} step={step:04d}]"


def resume_point(last_answered: tuple[str, int] | None, prompt: str, steps: int) -> tuple[str, int]:
    """The step a request asks for: one past the step its last message answers; else, when
    the last message is an agent's summary of its own compacted history, one past the
    progress it records (while that run is not done); else step 0 of a new run named by the
    prompt's hash."""
    if last_answered is not None:
        return last_answered[0], last_answered[1] + 1
    found = list(PROGRESS.finditer(prompt))
    if found:
        run, step = found[-1]["run"], int(found[-1]["step"])
        if step + 1 < steps:
            return run, step + 1
    return hashlib.sha256(prompt.encode()).hexdigest()[:8], 0


def progress_of(texts: list[str], answered: list[tuple[str, int]]) -> tuple[str, int] | None:
    """The latest step a request shows: its last tool result's, else the last summary tag."""
    if answered:
        return answered[-1]
    for text in reversed(texts):
        found = list(PROGRESS.finditer(text))
        if found:
            return found[-1]["run"], int(found[-1]["step"])
    return None


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def offers_bash(body: dict[str, Any]) -> bool:
    return any(isinstance(t, dict) and t.get("name") == "Bash" for t in body.get("tools") or [])


FORK_OPENING = "[compactd] This message is not from the user."
"""How compactd's instruction to a fork of the agent's request begins (its prompt's data)."""


def is_compactd_fork(body: dict[str, Any]) -> bool:
    """compactd asking for its summary as a fork of the agent's own request: the last block of
    the last message is compactd's instruction."""
    messages = body.get("messages") or []
    blocks = _blocks(messages[-1].get("content")) if messages else []
    last = blocks[-1] if blocks else {}
    return last.get("type") == "text" and str(last.get("text", "")).startswith(FORK_OPENING)


def is_agent_summary(body: dict[str, Any]) -> bool:
    """The agent asking the model to summarize its own conversation (its own compaction)."""
    messages = body.get("messages") or []
    if not messages:
        return False
    text = " ".join(
        b.get("text", "") for b in _blocks(messages[-1].get("content")) if b.get("type") == "text"
    )
    return any(marker.lower() in text.lower() for marker in AGENT_SUMMARY_MARKERS)


def _answered(message: dict[str, Any]) -> list[tuple[str, int]]:
    out = []
    for block in _blocks(message.get("content")):
        if block.get("type") == "tool_result":
            match = STEP_ID.match(str(block.get("tool_use_id", "")))
            if match:
                out.append((match["run"], int(match["step"])))
    return out


def _texts(body: dict[str, Any]) -> list[str]:
    return [
        b.get("text", "")
        for m in body.get("messages") or []
        for b in _blocks(m.get("content"))
        if b.get("type") == "text"
    ]


def next_step(body: dict[str, Any], steps: int) -> tuple[str, int]:
    """(run id, step index) the request asks for (see `resume_point`)."""
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    answered = _answered(last) if last.get("role") == "user" else []
    prompt = " ".join(
        b.get("text", "") for b in _blocks(last.get("content")) if b.get("type") == "text"
    )
    return resume_point(answered[-1] if answered else None, prompt, steps)


def step_command(step: int, lines: int) -> str:
    """A shell command whose output is `lines` numbered lines (~30 characters each)."""
    return f"seq -f 'step {step:04d} output line %05g of the listing' 1 {lines}"


def agent_content(
    body: dict[str, Any], *, steps: int, lines: int
) -> tuple[list[dict[str, Any]], str]:
    """The content blocks and stop reason of the scripted answer to `body`."""
    if is_agent_summary(body) or is_compactd_fork(body):
        # answered as a model would, so the agent's (or compactd's) compaction works
        answered = [a for m in body.get("messages") or [] for a in _answered(m)]
        point = progress_of(_texts(body), answered)
        tag = progress_tag(*point) if point else ""
        summary = "<analysis>Scripted.</analysis>\n<summary>The user asked for listings; the "
        summary += f"assistant ran them step by step. {tag}</summary>"
        return [{"type": "text", "text": summary}], "end_turn"
    if not offers_bash(body):
        return [{"type": "text", "text": "Scripted answer."}], "end_turn"
    run, step = next_step(body, steps)
    text = f"Step {step} of run {run}: keep listing."
    thinking = {"type": "thinking", "thinking": text, "signature": thinking_signature(text)}
    if step >= steps:
        return [thinking, {"type": "text", "text": f"Done: ran {steps} commands."}], "end_turn"
    call = {
        "type": "tool_use",
        "id": f"toolu_{run}_{step:04d}",
        "name": "Bash",
        "input": {"command": step_command(step, lines), "description": f"List step {step}"},
    }
    return [thinking, call], "tool_use"
