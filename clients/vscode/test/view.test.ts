// The extension's view logic, without VS Code. Run by `npm test` here and by the Node
// client's `npm test` (which `make test` runs).
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type { CompactResult, MeasureResult } from "../src/generated/protocol.js";
import {
  bar,
  chooseSession,
  compactMessage,
  contextItems,
  contextLines,
  daemonCommand,
  errorMessage,
  formatTokens,
  instructionsFrom,
  serveArgs,
  startFailureMessage,
  statusView,
} from "../src/view.js";

function measureOf(overrides: Partial<MeasureResult> = {}): MeasureResult {
  return {
    total: 77_400,
    window: 200_000,
    limit: 180_000,
    free: 102_600,
    outputReserve: 20_000,
    categories: {
      system: 1_200,
      tools: 0,
      user: 6_000,
      assistant: 3_700,
      tool_results: 66_500,
      output_reserve: 20_000,
      free: 102_600,
    },
    threshold: 153_000,
    advice: null,
    turns: 12,
    turnsShown: 12,
    ...overrides,
  };
}

describe("chooseSession", () => {
  const list = {
    sessions: [
      { sessionId: "old", sizeBytes: 10, modified: 100, loaded: false },
      { sessionId: "newest", sizeBytes: 10, modified: 300, loaded: false },
      { sessionId: "middle", sizeBytes: 10, modified: 200, loaded: true },
    ],
  };

  test("the setting wins when set", () => {
    assert.equal(chooseSession(" pinned ", list), "pinned");
  });

  test("else the most recently modified session", () => {
    assert.equal(chooseSession("", list), "newest");
    assert.equal(chooseSession(undefined, list), "newest");
  });

  test("none when there is no session", () => {
    assert.equal(chooseSession(undefined, { sessions: [] }), undefined);
    assert.equal(chooseSession(undefined, undefined), undefined);
  });
});

describe("statusView", () => {
  test("occupancy of the input limit, rounded", () => {
    const view = statusView(measureOf(), "s1");
    assert.equal(view.text, "ctx 43%");
    assert.equal(view.severity, "normal");
    assert.match(view.tooltip, /77,400 of 180,000 input tokens \(43%\)/);
    assert.match(view.tooltip, /session s1/);
  });

  test("a warning past the cascade threshold, an error at the limit", () => {
    assert.equal(statusView(measureOf({ total: 160_000 })).severity, "warning");
    assert.equal(statusView(measureOf({ total: 180_000 })).severity, "error");
  });

  test("advice from the daemon shows in the tooltip", () => {
    const view = statusView(measureOf({ advice: "run /compact" }));
    assert.match(view.tooltip, /run \/compact/);
  });

  test("a zero limit does not divide by zero", () => {
    assert.equal(statusView(measureOf({ total: 0, limit: 0 })).text, "ctx 0%");
  });
});

describe("contextItems", () => {
  test("a total first, content largest first, room last, empty categories left out", () => {
    const items = contextItems(measureOf());
    assert.deepEqual(
      items.map((item) => item.label),
      [
        "Total 77k / 180k",
        "Tool results",
        "User messages",
        "Assistant messages",
        "System prompt",
        "Reserved for output",
        "Free",
      ],
    );
    assert.equal(items[1]?.description, "67k tokens · 33%");
    assert.equal(items[1]?.detail, bar(66_500, 200_000));
  });

  test("unknown categories keep their wire name", () => {
    const items = contextItems(measureOf({ categories: { images: 500 } }));
    assert.equal(items[1]?.label, "images");
  });

  test("the same panel as text lines", () => {
    const lines = contextLines(measureOf());
    assert.equal(lines.length, 7);
    assert.match(lines[1] ?? "", /^Tool results\s+67k tokens · 33%\s+█+░+$/);
  });
});

test("formatTokens is short", () => {
  assert.equal(formatTokens(999), "999");
  assert.equal(formatTokens(1_234), "1.2k");
  assert.equal(formatTokens(2_000), "2k");
  assert.equal(formatTokens(45_678), "46k");
  assert.equal(formatTokens(1_250_000), "1.3M");
});

test("bar fills in proportion and never overflows", () => {
  assert.equal(bar(50, 100, 10), "█████░░░░░");
  assert.equal(bar(500, 100, 4), "████");
  assert.equal(bar(1, 0, 3), "░░░");
});

describe("compactMessage", () => {
  const base: CompactResult = {
    applied: true,
    tokensBefore: 9_748,
    tokensAfter: 7_938,
    reason: "/compact: summarized 4 turn(s)",
    provider: "digest",
    coveredTurns: 4,
  };

  test("what was saved when applied", () => {
    assert.equal(compactMessage(base), "compactd: summarized 4 turns: 9.7k → 7.9k tokens (1.8k saved)");
    assert.match(compactMessage({ ...base, coveredTurns: 1 }), /summarized 1 turn:/);
  });

  test("the daemon's reason when not", () => {
    assert.equal(
      compactMessage({ ...base, applied: false, reason: "short history", coveredTurns: 0 }),
      "compactd: not compacted — short history",
    );
  });
});

test("instructionsFrom: Escape cancels, blank means none", () => {
  assert.deepEqual(instructionsFrom(undefined), { cancelled: true });
  assert.deepEqual(instructionsFrom("   "), { cancelled: false });
  assert.deepEqual(instructionsFrom(" keep paths "), { cancelled: false, instructions: "keep paths" });
});

test("daemonCommand: setting, then environment, then compactd", () => {
  assert.deepEqual(daemonCommand("/venv/bin/compactd", "other"), { command: "/venv/bin/compactd", args: [] });
  assert.deepEqual(daemonCommand("", "python -m compactd"), { command: "python", args: ["-m", "compactd"] });
  assert.deepEqual(daemonCommand(undefined, undefined), { command: "compactd", args: [] });
});

test("serveArgs puts --data-dir before serve and the provider after", () => {
  assert.deepEqual(serveArgs({}), ["serve"]);
  assert.deepEqual(serveArgs({ dataDir: "/d", summaryProvider: "digest" }), [
    "--data-dir",
    "/d",
    "serve",
    "--summary-provider",
    "digest",
  ]);
  assert.deepEqual(serveArgs({ dataDir: " ", summaryProvider: "" }), ["serve"]);
});

test("errorMessage names compactd's error kind", () => {
  const error = Object.assign(new Error("no session 'x'"), { code: 4004, data: { kind: "unknown_session" } });
  assert.equal(errorMessage(error), "compactd (unknown_session): no session 'x'");
  assert.equal(errorMessage(new Error("boom")), "compactd: boom");
  assert.equal(errorMessage("plain"), "compactd: plain");
});

test("startFailureMessage: a missing daemon names the setting to set", () => {
  const missing = Object.assign(new Error("spawn compactd ENOENT"), { code: "ENOENT" });
  const text = startFailureMessage(missing, "compactd");
  assert.match(text, /daemon not found/);
  assert.match(text, /set `compactd\.command`/);
  assert.doesNotMatch(startFailureMessage(new Error("exit code 2"), "compactd"), /not found/);
});
