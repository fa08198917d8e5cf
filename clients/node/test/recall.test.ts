// Recall from Node: a scripted model reads a big file, finds the cut in its result,
// calls `compactd_recall` with the handle the marker names, and gets the lines back; the next
// request holds them after the previous request, unchanged. One daemon, its own data dir.
import assert from "node:assert/strict";
import { test } from "node:test";
import { CompactdError, type RecallToolUse } from "@compactd/client";
import { startDaemon } from "./helpers.js";

type Block = { type: string; [key: string]: unknown };
type Message = { role: string; content: string | Block[] };

const HANDLE = /recall:[A-Za-z0-9_.-]+/g;

function bigFile(lines: number): string {
  let out = "";
  for (let i = 1; i <= lines; i++) out += `node line ${i}: function f${i}(x) { return x + ${i}; }\n`;
  return out;
}

/** The request without its cache breakpoints (they mark, but are not, content). */
function stripped(request: Record<string, unknown>): Message[] {
  const messages = structuredClone(request.messages) as Message[];
  for (const message of messages) {
    if (Array.isArray(message.content)) for (const block of message.content) delete block.cache_control;
  }
  return messages;
}

test("an agent loop answers compactd_recall through the client", async (t) => {
  const client = await startDaemon(t, { summaryProvider: "digest" });
  const { sessionId } = await client.openSession({ config: { recall: true } });
  await client.append({ sessionId, messages: [{ role: "user", content: "what does f300 return?" }] });
  const file = bigFile(600);
  const requests: Array<Record<string, unknown>> = [];

  for (let step = 0; step < 3; step++) {
    const { request } = await client.render({ sessionId, cascade: true, system: "agent" });
    requests.push(request);
    const tools = request.tools as Array<{ name: string }>;
    assert.deepEqual(tools.map((tool) => tool.name), ["compactd_recall"]);
    const messages = request.messages as Message[];
    const last = JSON.stringify(messages[messages.length - 1]);
    let reply: Block[];
    if (step === 0) {
      reply = [{ type: "tool_use", id: "read1", name: "Read", input: { file_path: "big.js" } }];
    } else if (step === 1) {
      assert.ok(!last.includes("node line 300:"), "the middle of the file is cut");
      const [handle] = last.match(HANDLE) ?? [];
      assert.ok(handle, "the cut names a handle");
      reply = [{ type: "tool_use", id: "recall1", name: "compactd_recall", input: { handle, startLine: 299, endLine: 301 } }];
    } else {
      assert.ok(last.includes("node line 300: function f300(x) { return x + 300; }"));
      break;
    }
    await client.append({ sessionId, messages: [{ role: "assistant", content: reply }] });
    const call = reply[0] as unknown as RecallToolUse & { name: string };
    const result =
      call.name === "compactd_recall"
        ? await client.answerRecall(sessionId, call)
        : { type: "tool_result", tool_use_id: call.id, content: file };
    await client.append({ sessionId, messages: [{ role: "user", content: [result] }] });
  }
  const before = stripped(requests[1]!);
  const after = stripped(requests[2]!);
  assert.deepEqual(after.slice(0, before.length), before, "the cached prefix is unchanged");

  // a search: the line the model needs by what it holds, with its number, in one call
  const [cut] = JSON.stringify(requests[1]!.messages).match(HANDLE) ?? [];
  const found = await client.answerRecall(sessionId, { id: "s1", input: { handle: cut, search: "f450(x)", context: 0 } });
  assert.equal(found.is_error, undefined);
  assert.ok(found.content.includes("\n450:node line 450: function f450(x)"), found.content);
  const refused = await client.answerRecall(sessionId, { id: "s2", input: { handle: cut, search: "(a)\\1", regex: true } });
  assert.equal(refused.is_error, true);
  await assert.rejects(client.recall({ sessionId, handle: cut!, search: "(a)\\1", regex: true }), (error: unknown) => {
    return error instanceof CompactdError && error.kind === "invalid_search" && error.code === 4016;
  });

  const wrong = await client.answerRecall(sessionId, { id: "x", input: { handle: "recall:n999.0a1b2c3d" } });
  assert.equal(wrong.is_error, true);
  await assert.rejects(client.recall({ sessionId, handle: "recall:nope" }), (error: unknown) => {
    return error instanceof CompactdError && error.kind === "unknown_handle" && error.code === 4007;
  });
});
