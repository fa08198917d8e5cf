// The context methods against the real daemon: render, measure, snip, uncollapse,
// reportUsage, daemon/status, session/import of a real transcript compacted with the digest
// provider (announced by context/compacted), and session/replay. One daemon with its own
// data dir serves the subtests, each in its own session.
import assert from "node:assert/strict";
import { resolve } from "node:path";
import { test } from "node:test";
import { CompactdError, type CompactedNotification } from "@compactd/client";
import { conversation, records, startDaemon, TRANSCRIPTS } from "./helpers.js";

const MODEL = "claude-sonnet-4-5";

test("context methods", async (t) => {
  const client = await startDaemon(t, { summaryProvider: "digest" });
  const compacted: CompactedNotification[] = [];
  client.onCompacted((note) => compacted.push(note));

  await t.test("daemon/status", async () => {
    const status = await client.status();
    assert.match(status.version, /^\d+\.\d+/);
    assert.equal(status.summaryProvider, "digest");
    assert.deepEqual(status.loadedSessions, []);
    assert.equal(typeof status.dataDir, "string");
  });

  await t.test("render, measure and reportUsage", async () => {
    const { sessionId } = await client.openSession();
    await client.append({ sessionId, messages: conversation(3) });
    const system = "You are terse.";
    const rendered = await client.render({ sessionId, model: MODEL, system, maxOutputTokens: 1000 });
    assert.equal(rendered.request.model, MODEL);
    assert.equal(rendered.request.max_tokens, 1000);
    assert.match(JSON.stringify(rendered.request.system), /You are terse\./);
    assert.equal((rendered.request.messages as unknown[]).length, 6);
    assert.deepEqual(rendered.events, []);
    const total = rendered.tokens.total as number;
    assert.ok(total > 0);

    // measure is render's accounting without remembering anything: the same numbers.
    const measured = await client.measure({ sessionId, model: MODEL, system, maxOutputTokens: 1000 });
    assert.equal(measured.total, total);
    assert.equal(measured.limit, measured.window - measured.outputReserve);
    assert.equal(measured.free, measured.limit - measured.total);
    assert.equal(measured.turns, 3);
    assert.ok(measured.categories.user! > 0 && measured.categories.assistant! > 0);
    assert.ok(measured.threshold > 0 && measured.threshold < measured.limit);
    assert.deepEqual((await client.status()).loadedSessions.includes(sessionId), true);

    // The provider counted 10% more than compactd said: later counts for that model are
    // calibrated. estimatedTokens is compactd's own count before any ratio (a Claude model
    // starts from its prior ratio), and calibration is the provider's count over it.
    const report = await client.reportUsage({
      sessionId,
      model: MODEL,
      usage: { input_tokens: Math.round(total * 1.1), output_tokens: 12 },
    });
    const estimated = report.estimatedTokens as number;
    assert.ok(estimated > 0 && estimated < total, `${estimated} under the prior-scaled ${total}`);
    assert.equal(report.reportedTokens, Math.round(total * 1.1));
    assert.equal(report.overflow, false);
    assert.ok(Math.abs(report.calibration - Math.round(total * 1.1) / estimated) < 0.01);
    const calibrated = await client.measure({ sessionId, model: MODEL, system, maxOutputTokens: 1000 });
    assert.ok(calibrated.total > total);

    const overflow = await client.reportUsage({
      sessionId,
      model: MODEL,
      error: { status: 400, message: "prompt is too long: 250000 tokens > 200000 maximum" },
    });
    assert.equal(overflow.overflow, true);
    assert.equal(overflow.limitTokens, 200_000);
  });

  await t.test("snip removes the oldest turns down to a target", async () => {
    const { sessionId } = await client.openSession();
    await client.append({ sessionId, messages: conversation(8) });
    const before = await client.measure({ sessionId });

    const snipped = await client.snip({ sessionId, targetTokens: Math.round(before.total / 3) });
    assert.equal(snipped.applied, true, snipped.reason ?? "");
    assert.ok(snipped.removedTurns > 0);
    assert.equal(snipped.tokensBefore, before.total);
    assert.ok(snipped.tokensAfter < snipped.tokensBefore);
    assert.equal((await client.measure({ sessionId })).total, snipped.tokensAfter);
    assert.ok((await records(client, sessionId)).some((r) => r.kind === "snip"));
    assert.equal(compacted.at(-1)?.tier, "snip");
    assert.equal(compacted.at(-1)?.sessionId, sessionId);

    // Only protected turns are left: nothing more to remove, and the daemon says why.
    const nothing = await client.snip({ sessionId, targetTokens: 1 });
    assert.equal(nothing.applied, false);
    assert.equal(nothing.removedTurns, 0);
    assert.ok(nothing.reason);
  });

  await t.test("uncollapse of an unknown collapse id is a clear error", async () => {
    const { sessionId } = await client.openSession();
    await client.append({ sessionId, messages: conversation(1) });
    await assert.rejects(client.uncollapse({ sessionId, collapseId: "c-unknown" }), (error: unknown) => {
      assert.ok(error instanceof CompactdError);
      assert.ok(error.code >= 4000 && error.code < 5000, `a compactd code, got ${error.code}`);
      assert.equal(error.kind, (error.data as { kind: string }).kind);
      assert.match(error.message, /c-unknown/);
      return true;
    });
  });

  await t.test("a real Claude Code transcript imports and compacts with the digest provider", async () => {
    const path = resolve(TRANSCRIPTS, "claude-code/fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl");
    const imported = await client.importTranscript({ path });
    assert.equal(imported.sessionIds.length, 1);
    assert.ok(Array.isArray(imported.warnings));
    const sessionId = imported.sessionIds[0]!;
    assert.ok((await client.measure({ sessionId })).total > 1000);
    // The agent carries on in the imported session, so the imported turns become history the
    // summary may replace (the latest turns are always kept).
    await client.append({ sessionId, messages: conversation(2, 10) });
    const before = await client.measure({ sessionId });

    const notified = client.nextNotification("context/compacted", (n) => n.sessionId === sessionId);
    const result = await client.compact({ sessionId, instructions: "keep file paths" });
    assert.equal(result.applied, true, result.reason ?? "");
    assert.equal(result.provider, "digest");
    assert.equal(result.tokensBefore, before.total);
    assert.ok(result.tokensAfter < result.tokensBefore);
    assert.ok(result.coveredTurns >= 1);

    const note = await notified;
    assert.equal(note.tier, "summary");
    assert.equal(note.applied, true);
    assert.equal(note.tokensBefore, result.tokensBefore);
    assert.equal(note.tokensAfter, result.tokensAfter);
    assert.equal(note.recordIds.length, 1);
    const summary = (await records(client, sessionId)).find((r) => r.kind === "summary");
    assert.equal(summary?.id, note.recordIds[0]);
    assert.equal((await client.measure({ sessionId })).total, result.tokensAfter);

    await assert.rejects(client.importTranscript({ path: resolve(TRANSCRIPTS, "README.md") }), {
      name: "CompactdError",
    });
  });

  await t.test("replay prices every step of a real transcript and keeps nothing", async () => {
    const sessionsBefore = (await client.listSessions()).sessions.length;
    const path = resolve(TRANSCRIPTS, "swe-agent/pydicom__pydicom-1458.traj");
    const replayed = await client.replay({ path, ttl: "5m" });
    assert.equal(replayed.source, "pydicom__pydicom-1458");
    const steps = replayed.steps as Array<{ index: number; tokens: number; cost: number }>;
    assert.ok(steps.length > 1);
    assert.deepEqual(
      steps.map((s) => s.index),
      steps.map((_, i) => i),
    );
    assert.ok(steps.every((s) => s.tokens > 0 && s.cost > 0));
    assert.equal((await client.listSessions()).sessions.length, sessionsBefore);
  });
});
