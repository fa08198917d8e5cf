"""The summarizer's prompts are data (`summarizer/prompts/*.md`); these are the pure builders
that fill them in, and the parser of tool evidence's answer."""

from __future__ import annotations

from compactd.context.summarizer import digest
from compactd.context.summarizer.evidence import (
    EvidenceSource,
    batches,
    evidence_marker,
    evidence_prompt,
    evidence_request,
    parse_evidence,
)
from compactd.context.summarizer.instructions import (
    checkpoint_system,
    evidence_system,
    fork_instruction,
    prompt,
    quoted,
)
from compactd.context.tokens import Counter


def source(tag: str, tokens: int = 2000, *, error: bool = False) -> EvidenceSource:
    return EvidenceSource(f"n_{tag}", f"toolu_{tag}", "Bash", error, f"{tag} output\nok", tokens)


def test_the_checkpoint_asks_for_the_size_floor_and_honours_instructions() -> None:
    plain = checkpoint_system(None)
    assert plain == prompt("checkpoint")
    sized = checkpoint_system(None, (2000, 5000))
    assert "at most 5000 tokens" in sized and "at least 2000 tokens" in sized
    full = checkpoint_system("keep the migration notes", (2000, 2400), media=True)
    assert full.startswith(plain)
    assert full.endswith("follow them:\nkeep the migration notes")
    assert "Images and documents" in full
    assert "Images and documents" not in sized


def test_the_fork_names_the_part_it_replaces_and_carries_the_checkpoint_rules() -> None:
    checkpoint = checkpoint_system(None, (2000, 2800))
    text = fork_instruction(checkpoint, 9, quoted("Request k4: inspect module k4."))
    assert text.startswith("[compactd] This message is not from the user.")
    assert "up to the last 9 message(s), which stay" in text
    assert "the first of them begins with «Request k4: inspect module k4.»" in text
    assert text.endswith(checkpoint) and "{" not in text
    assert "do not call tools" in text and "stays too" not in text
    inside = fork_instruction(
        checkpoint,
        3,
        "a call to Bash (id toolu_7)",
        request="Refactor the parser.\nKeep the API.",
        hidden_requests=["Add tests.", "Use tabs."],
    )
    assert "begins with a call to Bash (id toolu_7)" in inside
    assert "stays too, verbatim, before your checkpoint: «Refactor the parser. Keep the API.»" in (
        inside
    )
    assert inside.endswith("the checkpoint keeps each one:\n- Add tests.\n- Use tabs.")


def test_quoted_is_one_line_and_clipped() -> None:
    assert quoted("  a\n b  ") == "«a b»"
    long = quoted("x" * 500, limit=40)
    assert len(long) == 42 and long.endswith("…»")


def test_the_evidence_prompt_names_id_tool_and_error() -> None:
    system = evidence_system(140)
    assert "at most 140 words" in system and "{" not in system
    text = evidence_prompt([source("a"), source("b", error=True)])
    assert '<result id="toolu_a" tool="Bash" error="false">\na output\nok\n</result>' in text
    assert '<result id="toolu_b" tool="Bash" error="true">' in text
    huge = EvidenceSource("n", "toolu_h", "Read", False, "x" * 100_000, 30_000)
    assert len(evidence_prompt([huge])) < 41_000  # a huge original is middle-truncated


def test_an_evidence_request_asks_for_a_line_per_result() -> None:
    request = evidence_request(
        [source("a"), source("b")], tokens_each=200, model="m", deadline=12.5, counter=Counter()
    )
    assert request.purpose == "evidence" and request.model == "m" and request.deadline == 12.5
    assert request.max_output_tokens == 450
    assert [i["id"] for i in request.items] == ["toolu_a", "toolu_b"]


def test_batches_keep_the_order_and_the_budget() -> None:
    srcs = [source("a", 900), source("b", 900), source("c", 900)]
    assert [[s.tool_use_id for s in b] for b in batches(srcs, 2000)] == [
        ["toolu_a", "toolu_b"],
        ["toolu_c"],
    ]
    assert len(batches(srcs, 100)) == 3  # a result over the budget goes alone


def test_parse_evidence_takes_the_first_line_of_each_expected_id() -> None:
    answer = (
        "Here you go:\n"
        "toolu_a: read 40 lines of config\n"
        "- `toolu_b`: exit code 1, 3 tests failed\n"
        "toolu_a: a second line is ignored\n"
        "toolu_zzz: not asked about\n"
        "toolu_c:\n"
    )
    assert parse_evidence(answer, ["toolu_a", "toolu_b", "toolu_c"]) == {
        "toolu_a": "read 40 lines of config",
        "toolu_b": "exit code 1, 3 tests failed",
    }
    assert parse_evidence("", ["toolu_a"]) == {}


def test_the_evidence_marker_keeps_tool_id_and_error() -> None:
    text = evidence_marker(source("b", 2345, error=True), "3 tests failed")
    assert text.startswith("[compactd tool evidence: Bash (toolu_b), an error;")
    assert "2,345-token result is kept in the session graph" in text
    assert text.endswith("\n3 tests failed")
    assert ", an error" not in evidence_marker(source("a"), "fine")


def test_the_digest_provider_writes_extractive_evidence() -> None:
    request = evidence_request(
        [
            EvidenceSource("n1", "toolu_1", "Bash", True, "run\nok\nERROR: boom\nmore", 2000),
            EvidenceSource("n2", "toolu_2", "Read", False, "\n\nfirst line\nsecond", 2000),
        ],
        tokens_each=100,
        model=None,
        deadline=None,
        counter=Counter(),
    )
    answer = digest.summarize(request)
    assert parse_evidence(answer.text, ["toolu_1", "toolu_2"]) == {
        "toolu_1": "4 lines; first: run; ERROR: boom",
        "toolu_2": "2 lines; first: first line",
    }
