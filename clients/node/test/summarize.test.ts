// The agent as the `client` summary provider: the daemon asks through context/summarize and
// the handler registered with onSummarize answers. Also cancellation and timeouts of a
// compact whose summary is still being written: -32800, and nothing is written. One daemon
// (`--summary-provider client`, its own data dir) serves the subtests, each in its own session.
import assert from "node:assert/strict";
import { test } from "node:test";
import {
  CancellationTokenSource,
  type CompactdClient,
  type SummarizeParams,
  type WorkDoneProgressValue,
} from "@compactd/client";
import { conversation, records, startDaemon } from "./helpers.js";

/** A summarize handler that does not answer until released, like a slow model call. */
function stallingHandler(client: CompactdClient) {
  let entered!: () => void;
  const inHandler = new Promise<void>((resolve) => (entered = resolve));
  let release!: () => void;
  const released = new Promise<void>((resolve) => (release = resolve));
  client.onSummarize(async () => {
    entered();
    await released;
    return { text: "too late" };
  });
  return { inHandler, release };
}

async function sessionWithHistory(client: CompactdClient): Promise<string> {
  const { sessionId } = await client.openSession();
  await client.append({ sessionId, messages: conversation(6) });
  return sessionId;
}

test("the client summary provider", async (t) => {
  const client = await startDaemon(t, { summaryProvider: "client" });

  await t.test("onSummarize answers context/summarize and the compact applies its text", async () => {
    const sessionId = await sessionWithHistory(client);
    const asked: SummarizeParams[] = [];
    const text = "SUMMARY: the build fails because the cache key misses the lockfile.";
    client.onSummarize((params) => {
      asked.push(params);
      return { text, model: "fake-1" };
    });
    const progress: WorkDoneProgressValue[] = [];
    client.onProgress("compact-1", (value) => progress.push(value));
    const notified = client.nextNotification("context/compacted", (n) => n.sessionId === sessionId);

    const result = await client.compact({ sessionId, instructions: "focus on the cause", workDoneToken: "compact-1" });
    assert.equal(result.applied, true, result.reason ?? "");
    assert.equal(result.provider, "client");
    assert.ok(result.tokensAfter < result.tokensBefore);

    assert.equal(asked.length, 1);
    const [params] = asked;
    assert.equal(params?.sessionId, sessionId);
    assert.equal(typeof params?.purpose, "string");
    assert.match(params?.prompt ?? "", /question 0/);
    assert.match(params?.system ?? "", /focus on the cause/);
    assert.ok((params?.maxOutputTokens ?? 0) > 0);

    const summary = (await records(client, sessionId)).find((r) => r.kind === "summary");
    assert.equal((summary?.data as { text: string }).text, text);
    assert.equal((await notified).recordIds[0], summary?.id);
    const { request } = await client.render({ sessionId });
    assert.ok(JSON.stringify(request).includes(text));
    assert.equal(progress[0]?.kind, "begin");
    assert.equal(progress.at(-1)?.kind, "end");
  });

  await t.test("without a working handler the compact says it did nothing and writes nothing", async () => {
    const sessionId = await sessionWithHistory(client);
    client.onSummarize(() => ({ text: "unused" })).dispose();
    const unanswered = await client.compact({ sessionId });
    assert.equal(unanswered.applied, false);
    assert.equal(typeof unanswered.failure, "string");
    assert.equal(unanswered.tokensAfter, unanswered.tokensBefore);
    assert.deepEqual(await records(client, sessionId), []);

    client.onSummarize(() => {
      throw new Error("the model is down");
    });
    const failed = await client.compact({ sessionId });
    assert.equal(failed.applied, false);
    assert.match(failed.reason ?? "", /model is down/);
    assert.deepEqual(await records(client, sessionId), []);
  });

  await t.test("cancelling a compact while the summary stalls rejects with -32800 and writes nothing", async () => {
    const sessionId = await sessionWithHistory(client);
    const stall = stallingHandler(client);
    try {
      const source = new CancellationTokenSource();
      const compacting = client.compact({ sessionId }, source.token);
      await stall.inHandler;
      source.cancel();
      await assert.rejects(compacting, (error: any) => {
        assert.equal(error.name, "CompactdError");
        assert.equal(error.code, -32800);
        assert.equal(error.kind, "request_cancelled");
        assert.equal(error.cancelled, true);
        return true;
      });
      assert.deepEqual(await records(client, sessionId), []);
    } finally {
      stall.release();
    }
    await new Promise((resolve) => setImmediate(resolve)); // the late answer is on its way
    assert.equal((await client.status()).summaryProvider, "client");
    // The late answer to the cancelled summary is dropped (it used to end the daemon), and the
    // session is not left locked: the next compact runs and applies.
    client.onSummarize(() => ({ text: "short" }));
    assert.equal((await client.compact({ sessionId })).applied, true);
  });

  await t.test("a call that outlives requestTimeoutMs is cancelled on the daemon and rejects as a timeout", async () => {
    const sessionId = await sessionWithHistory(client);
    const stall = stallingHandler(client);
    const timeout = client.requestTimeoutMs;
    client.requestTimeoutMs = 1_000;
    try {
      await assert.rejects(client.compact({ sessionId }), { code: -32800, kind: "timeout" });
    } finally {
      client.requestTimeoutMs = timeout;
      stall.release();
    }
    assert.deepEqual(await records(client, sessionId), []);
  });
});
