// Text a JavaScript string can hold but UTF-8 cannot: a string cut in the middle of an emoji
// keeps half of its surrogate pair, and `JSON.stringify` writes that half as `\ud83d`. The
// daemon answers such a request on its own id (the text repaired to U+FFFD, as a UTF-8
// encoder would), where it used to answer −32700 with id null and leave the call waiting.
import assert from "node:assert/strict";
import { test } from "node:test";
import { startDaemon } from "./helpers.js";

test("a string cut mid-emoji is stored, its half surrogate replaced", async (t) => {
  const client = await startDaemon(t);
  const { sessionId } = await client.openSession({ sessionId: "cut" });
  const cut = "done 😀 and more".slice(0, 6); // "done " and the first half of the emoji
  assert.equal(cut.charCodeAt(5), 0xd83d);
  await client.append({ sessionId, messages: [{ role: "user", content: cut }] });
  await client.append({ sessionId, messages: [{ role: "assistant", content: "whole 😀" }] });
  const inspected = await client.getSession({ sessionId });
  const texts = (inspected.nodes as Array<{ content: Array<{ text: string }> }>).map((n) => n.content[0]!.text);
  assert.deepEqual(texts, ["done \ufffd", "whole 😀"]);
});
