// Which daemon command the client runs: option, then $COMPACTD_COMMAND, then PATH.
import assert from "node:assert/strict";
import { chmod, mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { test } from "node:test";
import { CompactdClient, findOnPath, resolveCommand } from "@compactd/client";
import { tempDir } from "./helpers.js";

test("the option wins over the environment; strings split on whitespace", () => {
  const env = { COMPACTD_COMMAND: "/from/env", PATH: "" };
  assert.deepEqual(resolveCommand("python -m compactd", env), { file: "python", args: ["-m", "compactd"] });
  assert.deepEqual(resolveCommand(["/with space/compactd"], env), { file: "/with space/compactd", args: [] });
});

test("$COMPACTD_COMMAND is used next, also as a JSON array", () => {
  assert.deepEqual(resolveCommand(undefined, { COMPACTD_COMMAND: " /venv/bin/compactd ", PATH: "" }), {
    file: "/venv/bin/compactd",
    args: [],
  });
  assert.deepEqual(resolveCommand(undefined, { COMPACTD_COMMAND: '["/a b/python", "-m", "compactd"]', PATH: "" }), {
    file: "/a b/python",
    args: ["-m", "compactd"],
  });
  assert.throws(() => resolveCommand(undefined, { COMPACTD_COMMAND: "[1]" }), /not an array of strings/);
});

test("else `compactd` is looked up on PATH, with a clear error when it is missing", async (t) => {
  const dir = await tempDir(t);
  const bin = join(dir, "bin");
  await mkdir(bin);
  await writeFile(join(dir, "compactd"), "not executable");
  assert.throws(() => resolveCommand(undefined, { PATH: dir }), /cannot find `compactd` on PATH.*COMPACTD_COMMAND/);
  await writeFile(join(bin, "compactd"), "#!/bin/sh\n");
  await chmod(join(bin, "compactd"), 0o755);
  assert.deepEqual(resolveCommand(undefined, { PATH: `${dir}:${bin}` }), { file: join(bin, "compactd"), args: [] });
  assert.equal(findOnPath("compactd", { PATH: dir }), undefined);
});

test("spawning a command that does not exist fails with the command in the message", async (t) => {
  const dir = await tempDir(t);
  await assert.rejects(
    CompactdClient.spawn({ command: join(dir, "no-such-compactd") }),
    /cannot start the compactd daemon \(.*no-such-compactd\): .*ENOENT/,
  );
});
