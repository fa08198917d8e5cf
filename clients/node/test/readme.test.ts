// The README's agent loop is run as written, with the real `@anthropic-ai/sdk` against the
// loopback fake Messages server (tests/support/fake_anthropic.py), so the example cannot drift
// from the API: the model reads a file, calls compactd's recall tool, then answers.
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { mkdir, readFile, symlink, writeFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { test } from "node:test";
import { promisify } from "node:util";
import { DAEMON, PACKAGE_DIR, REPO_DIR, onEnd, tempDir } from "./helpers.js";

const PYTHON = resolve(REPO_DIR, ".venv/bin/python");

/** The fake Messages server in a child process, scripted; resolves with its base URL. */
async function startFake(t: import("node:test").TestContext, script: object): Promise<string> {
  const dir = await tempDir(t);
  const file = join(dir, "script.json");
  await writeFile(file, JSON.stringify(script));
  const fake = spawn(PYTHON, ["-m", "tests.support.fake_anthropic", "--port", "0", "--script", file], {
    cwd: REPO_DIR,
    stdio: ["ignore", "pipe", "inherit"],
  });
  onEnd(t, () => {
    fake.kill();
  });
  const lines = createInterface({ input: fake.stdout! });
  for await (const line of lines) {
    if (line.startsWith("PORT=")) return `http://127.0.0.1:${line.slice(5)}`;
  }
  throw new Error("the fake Anthropic server did not start");
}

async function sentMessages(baseUrl: string): Promise<Array<{ body: { messages: any[] } }>> {
  const got = (await (await fetch(`${baseUrl}/_fake/requests`)).json()) as { requests: any[] };
  return got.requests.filter((r) => r.path.endsWith("/messages"));
}

test("the README's agent loop runs with the anthropic SDK against the fake server", async (t) => {
  const readme = await readFile(join(PACKAGE_DIR, "README.md"), "utf8");
  const example = /```js\n([\s\S]*?)```/.exec(readme)?.[1];
  assert.ok(example?.includes("CompactdClient.spawn"), "the first js block is the agent loop");

  const calls = [
    { type: "text", text: "Let me read it." },
    { type: "tool_use", id: "toolu_read", name: "read_file", input: { path: "README.md" } },
    { type: "tool_use", id: "toolu_recall", name: "compactd_recall", input: { handle: "recall:n1.00000000" } },
  ];
  const baseUrl = await startFake(t, {
    messages: [{ kind: "text", content: calls, stop_reason: "tool_use" }],
    default: { kind: "text", text: "README.md says the answer is forty-two." },
  });
  const dir = await tempDir(t);
  await mkdir(join(dir, "node_modules/@compactd"), { recursive: true });
  await mkdir(join(dir, "node_modules/@anthropic-ai"), { recursive: true });
  await symlink(PACKAGE_DIR, join(dir, "node_modules/@compactd/client"), "dir");
  await symlink(join(PACKAGE_DIR, "node_modules/@anthropic-ai/sdk"), join(dir, "node_modules/@anthropic-ai/sdk"), "dir");
  await writeFile(join(dir, "agent.mjs"), example!);
  await writeFile(join(dir, "README.md"), "The answer is forty-two.\n");
  const { stdout } = await promisify(execFile)(process.execPath, ["agent.mjs"], {
    cwd: dir,
    env: { ...process.env, COMPACTD_COMMAND: DAEMON, ANTHROPIC_BASE_URL: baseUrl, ANTHROPIC_API_KEY: "test-key" },
    timeout: 60_000,
  });
  assert.match(stdout, /\d+ tokens → tool_use/);
  assert.match(stdout, /\d+ tokens → end_turn/);
  assert.match(stdout, /README.md says the answer is forty-two./);
  assert.match(stdout, /context: \d+ of \d+ tokens/);
  assert.match(stdout, /daemon exited with 0\n$/);

  const sent = await sentMessages(baseUrl);
  assert.equal(sent.length, 2);
  const messages = sent[1]!.body.messages;
  assert.deepEqual(
    messages.map((m: { role: string }) => m.role),
    ["user", "assistant", "user"],
  );
  const results = new Map(
    messages[2].content.filter((b: any) => b.type === "tool_result").map((b: any) => [b.tool_use_id, b]),
  );
  assert.match(JSON.stringify((results.get("toolu_read") as any).content), /forty-two/);
  assert.equal((results.get("toolu_recall") as any).is_error, true); // a made-up handle
});
