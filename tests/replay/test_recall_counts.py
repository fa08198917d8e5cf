"""The replay counts what recall is for: per run, the tool results Budget Reduction
cut on arrival and how many characters, the results Tier 1 cleared, and the handles the
requests showed: none without recall; with it, more than there are cut results (cleared
results and removed ranges name theirs too)."""

from __future__ import annotations

import tempfile

from compactd.context.engine import Engine
from compactd.context.importers import load_transcript
from compactd.context.replay import ReplayOptions, ReplayReport, replay
from compactd.context.stores.files import FileStore
from compactd.context.summarizer.driver import digest_answer, drive

from tests.replay.test_replay import LARGEST, RESERVE, SYSTEM, run


def run_with_recall() -> ReplayReport:
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine(FileStore(tmp), summary_provider="digest")
        imported = load_transcript(str(LARGEST))[0]
        options = ReplayOptions(
            window=64_000, reserve=RESERVE, ttl="1h", system_tokens=SYSTEM, config={"recall": True}
        )
        return drive(replay(engine, imported, options), digest_answer)


def test_the_replay_counts_cuts_clears_and_handles() -> None:
    off = run(LARGEST, 64_000).to_json()["recall"]
    on = run_with_recall().to_json()["recall"]
    # cut on arrival is a property of the transcript, not of recall
    assert on["cutResults"] == off["cutResults"] > 30
    assert on["cutChars"] == off["cutChars"] > 100_000
    assert off["clearedResults"] > 0 and on["clearedResults"] > 0
    assert off["handlesShown"] == 0
    assert on["handlesShown"] > on["cutResults"]  # cut results, cleared ones, removed ranges
