// The session graph methods against the real daemon: open, list, get, append, toolResult,
// function/start + complete, branch, checkout, and text that is not ASCII. One daemon (with
// its own data dir) serves the subtests, each in its own session: a daemon start costs ~2 s.
import assert from "node:assert/strict";
import { test } from "node:test";
import { conversation, startDaemon } from "./helpers.js";

test("session graph methods", async (t) => {
  const client = await startDaemon(t);

  await t.test("open, append, list and get a session", async () => {
    const opened = await client.openSession({ sessionId: "s1" });
    assert.deepEqual(opened, { sessionId: "s1", branch: "main", head: null, created: true });
    assert.equal((await client.openSession({ sessionId: "s1" })).created, false);
    const fresh = await client.openSession();
    assert.match(fresh.sessionId, /^\w+$/);
    assert.notEqual(fresh.sessionId, "s1");

    const appended = await client.append({ sessionId: "s1", messages: conversation(2) });
    assert.equal(appended.nodeIds.length, 4);
    assert.equal(appended.head, appended.nodeIds.at(-1));

    // expectedHead guards against another writer: a stale head is a 4030 and changes nothing.
    await assert.rejects(
      client.append({ sessionId: "s1", expectedHead: null, messages: [{ role: "user", content: "late" }] }),
      { name: "CompactdError", code: 4030, kind: "head_conflict" },
    );
    const guarded = await client.append({
      sessionId: "s1",
      expectedHead: appended.head,
      messages: [{ role: "user", content: "next" }],
    });
    assert.equal(guarded.nodeIds.length, 1);

    const { sessions } = await client.listSessions();
    const listed = sessions.map((s) => s.sessionId);
    assert.ok(listed.includes("s1") && listed.includes(fresh.sessionId), listed.join(", "));
    const s1 = sessions.find((s) => s.sessionId === "s1")!;
    assert.ok(s1.sizeBytes > 0 && s1.modified > 0 && s1.loaded);

    const inspected = await client.getSession({ sessionId: "s1" });
    assert.equal(inspected.head, guarded.head);
    const nodes = inspected.nodes as Array<{ id: string; kind: string }>;
    assert.deepEqual(
      nodes.map((n) => n.kind),
      ["user", "assistant", "user", "assistant", "user"],
    );
  });

  await t.test("tool calls wait for their results; functions record a sub-agent's thread", async () => {
    const { sessionId } = await client.openSession();
    await client.append({
      sessionId,
      messages: [
        { role: "user", content: "list the files" },
        {
          role: "assistant",
          content: [
            { type: "text", text: "Looking." },
            { type: "tool_use", id: "toolu_1", name: "ls", input: { path: "." } },
          ],
        },
      ],
    });
    await assert.rejects(client.render({ sessionId }), {
      code: 4020,
      kind: "pending_tool_results",
      data: { kind: "pending_tool_results", pendingToolUseIds: ["toolu_1"] },
    });
    const afterResult = await client.toolResult({ sessionId, toolUseId: "toolu_1", content: "a.txt\nb.txt" });
    assert.equal(typeof afterResult.head, "string");
    await assert.rejects(client.toolResult({ sessionId, toolUseId: "toolu_1", content: "again" }), {
      code: 4011,
      kind: "invalid_pairing",
    });

    const { functionId } = await client.functionStart({ sessionId, name: "researcher", input: { question: "why?" } });
    const inner = await client.append({
      sessionId,
      functionId,
      messages: [
        { role: "user", content: "find out why" },
        { role: "assistant", content: "because" },
      ],
    });
    assert.equal(inner.nodeIds.length, 2);
    await client.functionComplete({ sessionId, functionId, output: "because", status: "completed" });
    const fn = await client.getSession({ sessionId, nodeId: functionId });
    const node = fn.node as { kind: string; status: string; output: unknown; head: string };
    assert.equal(node.kind, "function");
    assert.equal(node.status, "completed");
    assert.equal(node.output, "because");
    assert.equal(node.head, inner.head);
    assert.equal((fn.children as unknown[]).length, 2);

    const rendered = await client.render({ sessionId });
    assert.match(JSON.stringify(rendered.request), /a\.txt\\nb\.txt/);
  });

  await t.test("branch and checkout keep two threads apart", async () => {
    const { sessionId } = await client.openSession();
    const base = await client.append({ sessionId, messages: conversation(1) });
    assert.deepEqual(await client.branch({ sessionId, name: "alt" }), { branch: "alt", head: base.head });
    assert.deepEqual(await client.checkout({ sessionId, branch: "alt" }), { branch: "alt", head: base.head });
    const onAlt = await client.append({ sessionId, messages: [{ role: "user", content: "only on alt" }] });
    assert.deepEqual(await client.checkout({ sessionId, branch: "main" }), { branch: "main", head: base.head });

    const alt = await client.getSession({ sessionId, branch: "alt" });
    assert.equal(alt.head, onAlt.head);
    const mainView = await client.render({ sessionId });
    const altView = await client.render({ sessionId, branch: "alt" });
    assert.doesNotMatch(JSON.stringify(mainView.request), /only on alt/);
    assert.match(JSON.stringify(altView.request), /only on alt/);

    await assert.rejects(client.checkout({ sessionId, branch: "nope" }), { code: 4006, kind: "unknown_branch" });
    await assert.rejects(client.branch({ sessionId, name: "x", fromNode: "n999" }), {
      code: 4005,
      kind: "unknown_node",
    });
  });

  await t.test("non-ASCII text round-trips unchanged through get and render", async () => {
    const text = "héllo ✓ 日本 🎉";
    const { sessionId } = await client.openSession({ sessionId: "unicode" });
    await client.append({
      sessionId,
      messages: [
        { role: "user", content: text },
        { role: "assistant", content: [{ type: "text", text: `${text} — ok` }] },
      ],
    });
    const nodes = (await client.getSession({ sessionId })).nodes as Array<{ content: Array<{ text: string }> }>;
    assert.equal(nodes[0]?.content[0]?.text, text);
    assert.equal(nodes[1]?.content[0]?.text, `${text} — ok`);

    const { request } = await client.render({ sessionId });
    const messages = request.messages as Array<{ content: Array<{ type: string; text: string }> }>;
    assert.equal(messages[0]?.content.find((b) => b.type === "text")?.text, text);
    assert.equal(messages[1]?.content.find((b) => b.type === "text")?.text, `${text} — ok`);

    const openai = await client.render({ sessionId, format: "openai" });
    assert.ok(JSON.stringify(openai.request).includes(text));
  });
});
