// Errors arrive as CompactdError with the daemon's code, data.kind and data.
import assert from "node:assert/strict";
import { test } from "node:test";
import { CompactdClient, CompactdError, ERROR_CODES, RpcCodes } from "@compactd/client";
import { conversation, DAEMON, startDaemon, tempDir } from "./helpers.js";

test("compactd errors carry code, kind and data; bad params are -32602", async (t) => {
  const client = await startDaemon(t);

  await assert.rejects(client.getSession({ sessionId: "nope" }), (error: unknown) => {
    assert.ok(error instanceof CompactdError);
    assert.equal(error.code, ERROR_CODES.unknown_session);
    assert.equal(error.code, 4004);
    assert.equal(error.kind, "unknown_session");
    assert.deepEqual(error.data, { kind: "unknown_session", sessionId: "nope" });
    assert.equal(error.method, "session/get");
    assert.match(error.message, /^session\/get: no session 'nope'/);
    return true;
  });

  await assert.rejects(client.openSession({ sessionId: "../escape" }), { code: 4000, kind: "invalid_session_id" });

  // Wrong types get through TypeScript only with a cast; the daemon names the field.
  await assert.rejects(client.request("session/get", { sessionId: 5 } as never), (error: unknown) => {
    assert.ok(error instanceof CompactdError);
    assert.equal(error.code, RpcCodes.InvalidParams);
    assert.equal(error.kind, "invalid_params");
    assert.match(error.message, /params\.sessionId/);
    return true;
  });
  await assert.rejects(client.append({} as never), { code: -32602, kind: "invalid_params" });

  await assert.rejects(client.request("session/nope" as never, {} as never), {
    code: RpcCodes.MethodNotFound,
    kind: "method_not_found",
  });

  // Bad input changes nothing: the session still has no nodes.
  const { sessionId } = await client.openSession();
  await assert.rejects(
    client.append({ sessionId, messages: [{ role: "robot", content: 5 }] }),
    (error: unknown) => error instanceof CompactdError && error.code >= 4000 && error.code < 5000,
  );
  assert.deepEqual((await client.getSession({ sessionId })).nodes, []);
});

test("a daemon that dies fails the pending call with its exit and stderr, not a hang", async (t) => {
  const dataDir = await tempDir(t);
  const client = await CompactdClient.spawn({ command: DAEMON, dataDir, summaryProvider: "client" });
  const { sessionId } = await client.openSession();
  await client.append({ sessionId, messages: conversation(6) });
  let entered!: () => void;
  const inHandler = new Promise<void>((resolve) => (entered = resolve));
  client.onSummarize(() => {
    entered();
    return new Promise(() => undefined); // never answers
  });
  const compacting = client.compact({ sessionId });
  await inHandler;
  client.process!.kill("SIGKILL");
  await assert.rejects(compacting, (error: unknown) => {
    assert.ok(error instanceof CompactdError);
    assert.equal(error.kind, "connection_closed");
    assert.match(error.message, /the daemon closed the connection/);
    return true;
  });
  assert.equal(await client.exited, null); // killed by a signal
  assert.equal(await client.close(), null);
  await assert.rejects(client.status(), { kind: "connection_closed", message: /the client was closed/ });
});

test("a daemon that exits at once: calls fail with its exit code and stderr", async (t) => {
  const dataDir = await tempDir(t);
  // A stand-in that dies the way a broken install does, without starting Python.
  const command = [process.execPath, "-e", "process.stderr.write('compactd: bad install\\n'); process.exit(3)", "--"];
  const client = await CompactdClient.spawn({ command, dataDir });
  await assert.rejects(client.status(), (error: unknown) => {
    assert.ok(error instanceof CompactdError);
    assert.equal(error.kind, "connection_closed");
    assert.match(error.message, /exit code 3/);
    assert.match(error.message, /compactd: bad install/);
    return true;
  });
  assert.equal(await client.close(), 3);
});
