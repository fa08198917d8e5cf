// The packages as a user gets them: `npm pack` of this client and `vsce package` of the VS Code
// extension, both offline, both without a warning, and holding only what a user needs.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { test } from "node:test";
import { promisify } from "node:util";
import { PACKAGE_DIR, tempDir } from "./helpers.js";

const run = promisify(execFile);
const VSCODE_DIR = resolve(PACKAGE_DIR, "../vscode");
/** Offline: nothing may be fetched while packing. */
const OFFLINE = { ...process.env, npm_config_offline: "true", npm_config_update_notifier: "false" };

test("npm pack ships the built client, its types, README and LICENSE — no tests, no build info", async () => {
  const { stdout, stderr } = await run("npm", ["pack", "--dry-run", "--json"], { cwd: PACKAGE_DIR, env: OFFLINE });
  assert.doesNotMatch(stderr, /warn/i);
  const [packed] = JSON.parse(stdout) as Array<{ files: Array<{ path: string }> }>;
  const files = packed!.files.map((f) => f.path).sort();
  for (const needed of ["LICENSE", "README.md", "dist/index.js", "dist/index.d.ts", "dist/generated/protocol.d.ts"]) {
    assert.ok(files.includes(needed), `${needed} is missing from ${files.join(", ")}`);
  }
  assert.deepEqual(
    files.filter((f) => f.includes("tests/") || f.endsWith(".tsbuildinfo") || f.startsWith("src/")),
    [],
  );
});

test(
  "vsce package: one bundled file, LICENSE and README, no warning",
  { skip: !existsSync(join(VSCODE_DIR, "node_modules/.bin/vsce")) && "clients/vscode has no node_modules (npm ci there)" },
  async (t) => {
    const out = join(await tempDir(t), "compactd.vsix");
    const vsce = join(VSCODE_DIR, "node_modules/.bin/vsce");
    const packed = await run(vsce, ["package", "--out", out], { cwd: VSCODE_DIR, env: OFFLINE, timeout: 120_000 });
    const said = packed.stdout + packed.stderr;
    assert.doesNotMatch(said, /warning/i, said);
    assert.ok(existsSync(out));
    const { stdout } = await run(vsce, ["ls"], { cwd: VSCODE_DIR, env: OFFLINE });
    assert.deepEqual(stdout.trim().split("\n").sort(), ["LICENSE", "README.md", "dist/extension.js", "package.json"]);
  },
);
