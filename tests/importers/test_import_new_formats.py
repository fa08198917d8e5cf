"""The formats a user's own agent writes, each imported from a real file (provenance in
tests/data/transcripts/README.md) and rendered with pairing intact: Gemini CLI, aider,
mini-swe-agent, and plain messages (a JSON array, `{"messages": …}` and chat JSONL — the last
two reshaped in code from real files). Cline's task history is built in code in the shape
real ones have (the real files found carry no licence that allows copying them here)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from compactd.context.engine import Engine, RenderParams
from compactd.context.errors import InvalidContent
from compactd.context.importers import detect_format, load_transcript
from compactd.context.importers.apply import import_session
from compactd.context.importers.plan import ImportedSession, Messages, ModelCall
from compactd.context.stores import FileStore

from tests.support.invariants import check_anthropic_pairing, check_openai_pairing

TRANSCRIPTS = Path(__file__).resolve().parents[1] / "data" / "transcripts"
GEMINI = TRANSCRIPTS / "gemini-cli/session-2026-03-14T16-40-97253fa9.json"
AIDER = TRANSCRIPTS / "aider/.aider.chat.history.md"
MINI = TRANSCRIPTS / "mini-swe-agent/astropy__astropy-12907.traj.json"
MESSAGES = TRANSCRIPTS / "messages/github_issue.traj.json"
SMALL_CLAUDE = TRANSCRIPTS / "claude-code/fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl"


def imported(tmp_path: Path, sessions: list[ImportedSession]) -> list[tuple[Engine, str]]:
    engine = Engine(FileStore(tmp_path / "store"))
    out = []
    for one in sessions:
        session = import_session(engine.library, one)
        engine.sessions[session.id] = session
        out.append((engine, session.id))
    return out


def rendered(engine: Engine, sid: str, fmt: str = "anthropic") -> dict:
    request = engine.render(sid, RenderParams(spec=_spec(fmt))).request
    (check_anthropic_pairing if fmt == "anthropic" else check_openai_pairing)(request)
    return request


def _spec(fmt: str):
    from compactd.context.render.request import RequestSpec

    return RequestSpec(format=fmt)


def calls_and_results(session: ImportedSession) -> tuple[int, int]:
    uses = results = 0
    for op in session.ops:
        if isinstance(op, Messages):
            for message in op.messages:
                for block in message["content"] if isinstance(message["content"], list) else []:
                    uses += block.get("type") == "tool_use"
                    results += block.get("type") == "tool_result"
    return uses, results


@pytest.mark.parametrize(
    ("path", "name"),
    [(GEMINI, "gemini-cli"), (AIDER, "aider"), (MINI, "mini-swe-agent"), (MESSAGES, "messages")],
)
def test_each_real_file_is_detected_and_renders_with_pairing(tmp_path, path, name):
    assert detect_format(path) == name
    sessions = load_transcript(path)
    for engine, sid in imported(tmp_path, sessions):
        for fmt in ("anthropic", "openai"):
            assert rendered(engine, sid, fmt)["messages"]


def test_gemini_cli_calls_results_and_usage(tmp_path):
    [session] = load_transcript(GEMINI)
    assert session.source_id == "97253fa9-55cd-4a38-b241-17369143df91"
    assert calls_and_results(session) == (3, 3)
    usage = [op.usage for op in session.ops if isinstance(op, ModelCall)]
    assert len(usage) == 5 and usage[0] == {
        "input_tokens": 7888 - 2949,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 2949,
        "output_tokens": 21 + 126,
    }
    [(engine, sid)] = imported(tmp_path, [session])
    text = orjson.dumps(rendered(engine, sid)).decode()
    assert "Create a README file for this project" in text and "# CLAUDE.md" in text


def test_aider_each_launch_is_a_session_without_aiders_own_output(tmp_path):
    sessions = load_transcript(AIDER)
    assert [s.source_id.split()[0] for s in sessions] == [f"{AIDER.name}#{i}" for i in (1, 2, 3)]
    second = sessions[1]
    usage = [op.usage for op in second.ops if isinstance(op, ModelCall)]
    assert usage[0] == {"input_tokens": 1800, "output_tokens": 653}
    [_, (engine, sid), _] = imported(tmp_path, sessions)
    text = orjson.dumps(rendered(engine, sid)).decode()
    assert "Про что проект мозгослав" in text
    assert "Tokens: 1.8k sent" not in text and "Aider v0.86.2" not in text


def test_mini_swe_agent_pairs_its_tool_calls(tmp_path):
    [session] = load_transcript(MINI)
    assert session.model == "deepseek/deepseek-chat" and session.system
    assert calls_and_results(session) == (64, 63)  # the submission's call ends the run
    [(engine, sid)] = imported(tmp_path, [session])
    request = rendered(engine, sid)
    assert "separability_matrix" in orjson.dumps(request["messages"][0]).decode()


def test_a_plain_openai_messages_array(tmp_path):
    [session] = load_transcript(MESSAGES)
    assert session.source_format == "messages" and session.system.startswith("You are a")
    [(engine, sid)] = imported(tmp_path, [session])
    roles = [m["role"] for m in rendered(engine, sid)["messages"]]
    assert roles[0] == "user" and "assistant" in roles


@pytest.mark.parametrize("shape", ["array", "object", "jsonl"])
def test_anthropic_messages_in_every_shape_import_as_they_render(tmp_path, shape):
    """A real Claude Code session's rendered messages (Anthropic blocks, tool_use and
    tool_result included), written as your own agent would keep them, import back to the
    same conversation."""
    [(engine, sid)] = imported(tmp_path, load_transcript(SMALL_CLAUDE))
    messages = [
        {"role": m["role"], "content": m["content"]} for m in rendered(engine, sid)["messages"]
    ]
    for message in messages:  # what a client keeps has no cache marks
        for block in message["content"] if isinstance(message["content"], list) else []:
            block.pop("cache_control", None)
    file = tmp_path / f"log.{shape}"
    if shape == "array":
        file.write_bytes(orjson.dumps(messages))
    elif shape == "object":
        file.write_bytes(orjson.dumps({"system": "Be brief.", "messages": messages}))
    else:
        file.write_bytes(b"\n".join(orjson.dumps(m) for m in messages))
    assert detect_format(file) == "messages"
    [again] = load_transcript(file)
    assert again.system == ("Be brief." if shape == "object" else None)
    [(engine2, sid2)] = imported(tmp_path / "again", [again])
    back = rendered(engine2, sid2)["messages"]
    assert len(back) == len(messages)
    assert calls_and_results(again)[0] == sum(
        b.get("type") == "tool_use"
        for m in messages
        if isinstance(m["content"], list)
        for b in m["content"]
    )


def test_a_markdown_file_that_is_no_aider_history_names_the_formats(tmp_path):
    notes = tmp_path / "notes.md"
    notes.write_text("# My notes\n\nNothing to import here.\n")
    with pytest.raises(InvalidContent) as caught:
        detect_format(notes)
    message = str(caught.value)
    assert "neither JSON, JSONL nor an aider chat history" in message
    for name in ("Gemini CLI", "aider", "Cline/Roo", "mini-swe-agent", "chat JSONL"):
        assert name in message


def cline_history(stamped: bool) -> list[dict]:
    """A Cline task history in the shape real ones of 2026 have (written here, not copied:
    the real files found carry no licence): native `tool_use` blocks answered by text blocks
    `[tool for 'arg'] Result:`, the extension's `<environment_details>` on every user message,
    a refused second call, and a task interrupted with a call still open."""
    env = {"type": "text", "text": "<environment_details>\n# VSCode Visible Files\napp.py\n"}
    env["text"] += "</environment_details>"

    def use(call_id: str, name: str, **args: str) -> dict:
        return {"type": "tool_use", "id": call_id, "name": name, "input": args}

    def text(value: str) -> dict:
        return {"type": "text", "text": value}

    history = [
        {"role": "user", "content": [text("<task>\nFix the retry loop in app.py\n</task>"), env]},
        {
            "role": "assistant",
            "content": [text("Reading it."), use("t1", "read_file", path="app.py")],
        },
        {
            "role": "user",
            "content": [text("[read_file for 'app.py'] Result:\n" + "x = 1\n" * 400), env],
        },
        {
            "role": "assistant",
            "content": [
                use("t2", "search_files", regex="retry["),
                use("t3", "read_file", path="b"),
            ],
        },
        {
            "role": "user",
            "content": [
                text("[search_files for 'retry['] Result:\nFound 1 result.\napp.py"),
                text("Tool [read_file] was not executed because a tool has already been used"),
                env,
            ],
        },
        {
            "role": "assistant",
            "content": [use("t4", "ask_followup_question", question="## Plan\n[ok]?")],
        },
        {
            "role": "user",
            "content": [
                text(
                    "[ask_followup_question for '## Plan\n[ok]?'] Result:\n<answer>\nyes\n</answer>"
                ),
                env,
            ],
        },
        {"role": "assistant", "content": [use("t5", "replace_in_file", path="app.py")]},
        {
            "role": "user",
            "content": [
                text("[TASK RESUMPTION] This task was interrupted 3 hours ago."),
                text(
                    "New instructions for task continuation:\n"
                    "<user_message>\nAlso add a test\n</user_message>"
                ),
                env,
            ],
        },
        {"role": "assistant", "content": [text("Adding the test.")]},
    ]
    if stamped:
        for k, message in enumerate(history):
            message["ts"] = 1_767_225_700_000 + 1000 * k
            if message["role"] == "assistant":
                message["metrics"] = {"tokens": {"prompt": 900 + k, "completion": 40, "cached": 0}}
                message["modelInfo"] = {"modelId": "claude-sonnet-4-5-20250929"}
    return history


@pytest.mark.parametrize("stamped", [False, True], ids=["without-ts", "with-ts"])
def test_a_cline_task_history_pairs_its_text_results(tmp_path, stamped):
    """Each result text answers its call, in order (a refusal as an error); the extension's
    own text around the results is meta, so a tool round trip is no new user turn; an
    interrupted call keeps `[no result recorded]` and the resumption is the next turn."""
    task = tmp_path / "tasks" / "1767225700000"
    task.mkdir(parents=True)
    file = task / "api_conversation_history.json"
    file.write_bytes(orjson.dumps(cline_history(stamped)))
    assert detect_format(file) == "cline"
    [session] = load_transcript(file)
    assert session.title == "Fix the retry loop in app.py" and session.source_id == task.name
    assert calls_and_results(session) == (5, 4)  # t5 was interrupted
    [(engine, sid)] = imported(tmp_path, [session])
    request = rendered(engine, sid)
    results = {
        b["tool_use_id"]: b
        for m in request["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    }
    assert set(results) == {"t1", "t2", "t3", "t4", "t5"}
    assert "Found 1 result." in orjson.dumps(results["t2"]).decode()
    assert (
        results["t3"].get("is_error") is True
        and "[no result recorded]" in orjson.dumps(results["t5"]).decode()
    )
    assert "<answer>" in orjson.dumps(results["t4"]).decode()  # brackets in the quoted argument
    rendered(engine, sid, "openai")
    tokens = engine.render(sid, RenderParams(spec=_spec("anthropic"))).tokens()
    assert tokens["turns"] == 2  # the task, and the request after the interruption
    assert tokens["categories"]["tool_results"] > tokens["categories"]["user"]
    if stamped:
        assert session.model == "claude-sonnet-4-5-20250929"
