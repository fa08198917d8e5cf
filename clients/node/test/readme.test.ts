// The README's agent loop is run as written, so the example cannot drift from the API.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdir, readFile, symlink, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { test } from "node:test";
import { promisify } from "node:util";
import { DAEMON, PACKAGE_DIR, tempDir } from "./helpers.js";

test("the README's agent loop runs against the real daemon", async (t) => {
  const readme = await readFile(join(PACKAGE_DIR, "README.md"), "utf8");
  const example = /```js\n([\s\S]*?)```/.exec(readme)?.[1];
  assert.ok(example?.includes("CompactdClient.spawn"), "the first js block is the agent loop");

  const dir = await tempDir(t);
  await mkdir(join(dir, "node_modules/@compactd"), { recursive: true });
  await symlink(PACKAGE_DIR, join(dir, "node_modules/@compactd/client"), "dir");
  await writeFile(join(dir, "agent.mjs"), example!);
  const { stdout } = await promisify(execFile)(process.execPath, ["agent.mjs"], {
    cwd: dir,
    env: { ...process.env, COMPACTD_COMMAND: DAEMON },
    timeout: 45_000,
  });
  assert.match(stdout, /tokens → I read 1 messages/);
  assert.match(stdout, /tokens → I read 5 messages/);
  assert.match(stdout, /context: \d+ of \d+ tokens/);
  assert.match(stdout, /daemon exited with 0\n$/);
});
