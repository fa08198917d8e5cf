// Starting and ending: clean shutdown with exit code 0, attaching to streams, and the
// notifications a second daemon on the same data dir and the idle timer cause.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { test } from "node:test";
import { CompactdClient } from "@compactd/client";
import { DAEMON, startDaemon, tempDir } from "./helpers.js";

test("close sends shutdown and exit, and returns the exit code 0", async (t) => {
  const dataDir = await tempDir(t);
  const client = await CompactdClient.spawn({ command: DAEMON, dataDir });
  await client.status();
  assert.equal(await client.close(), 0);
  assert.equal(await client.exited, 0);
  assert.equal(client.process?.exitCode, 0);
  assert.equal(await client.close(), 0, "closing twice is harmless");
  await assert.rejects(client.status(), { kind: "connection_closed" });
});

test("attach talks over streams someone else opened", async (t) => {
  const dataDir = await tempDir(t);
  const child = spawn(DAEMON, ["--data-dir", dataDir, "serve"], { stdio: ["pipe", "pipe", "inherit"] });
  const exited = once(child, "exit");
  const client = CompactdClient.attach(child.stdout, child.stdin);
  assert.equal((await client.status()).dataDir, dataDir);
  assert.equal(await client.close(), null, "not our process: no exit code to report");
  const [code] = await exited;
  assert.equal(code, 0);
});

test("another daemon's append arrives as session/changed; an idle session as session/idle", async (t) => {
  const dataDir = await tempDir(t);
  const idle = ["--idle-seconds", "1", "--idle-check-seconds", "0.2"];
  const [writer, watcher] = await Promise.all([
    startDaemon(t, { dataDir, serveArgs: idle }),
    startDaemon(t, { dataDir, serveArgs: idle }),
  ]);
  const { sessionId } = await writer.openSession({ sessionId: "shared" });
  const first = await writer.append({ sessionId, messages: [{ role: "user", content: "hi" }] });
  // The watcher loads the session with session/open, as an editor following it would.
  assert.equal((await watcher.openSession({ sessionId })).head, first.head);

  const changed = watcher.nextNotification("session/changed", (n) => n.sessionId === sessionId);
  // Both daemons have the session loaded: the idle work is done once (its record tells the
  // other daemon it is done), by whichever daemon's timer comes first — so either notifies.
  const idleNote = Promise.any([
    writer.nextNotification("session/idle", (n) => n.sessionId === sessionId),
    watcher.nextNotification("session/idle", (n) => n.sessionId === sessionId),
  ]);
  const second = await writer.append({ sessionId, messages: [{ role: "assistant", content: "hello" }] });
  const note = await changed;
  assert.equal(note.heads.main, second.head);
  assert.ok(note.events >= 1 && note.seq > 0);
  assert.equal((await watcher.getSession({ sessionId })).head, second.head);

  const idleSeen = await idleNote;
  assert.ok(idleSeen.idleSeconds >= 1);
  assert.equal(typeof idleSeen.cleared, "number");
});
