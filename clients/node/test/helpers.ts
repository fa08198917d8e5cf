// Shared by the tests: where the real daemon and the test transcripts are, and a daemon per
// test in its own temporary data dir, closed (and checked to exit 0) when the test ends.
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import type { TestContext } from "node:test";
import { CompactdClient, type SpawnOptions } from "@compactd/client";

/** clients/node, found from wherever the compiled tests run. */
export const PACKAGE_DIR = findPackageDir(__dirname);
export const REPO_DIR = resolve(PACKAGE_DIR, "../..");
/** The daemon under test: the repo's venv (override with $COMPACTD_TEST_COMMAND). */
export const DAEMON = process.env.COMPACTD_TEST_COMMAND ?? resolve(REPO_DIR, ".venv/bin/compactd");
export const TRANSCRIPTS = resolve(REPO_DIR, "tests/data/transcripts");

function findPackageDir(start: string): string {
  for (let dir = start; ; dir = dirname(dir)) {
    const manifest = join(dir, "package.json");
    if (existsSync(manifest) && JSON.parse(readFileSync(manifest, "utf8")).name === "@compactd/client") {
      return dir;
    }
    if (dirname(dir) === dir) throw new Error(`no @compactd/client package.json above ${start}`);
  }
}

/**
 * Run `fn` when the test ends, last registered first (node:test runs `after` hooks in
 * registration order, which would delete a data dir under a daemon still running).
 */
export function onEnd(t: TestContext, fn: () => unknown): void {
  let stack = cleanups.get(t);
  if (stack === undefined) {
    const fresh: Array<() => unknown> = [];
    cleanups.set(t, fresh);
    t.after(async () => {
      for (const cleanup of fresh.reverse()) await cleanup();
    });
    stack = fresh;
  }
  stack.push(fn);
}

const cleanups = new WeakMap<TestContext, Array<() => unknown>>();

export async function tempDir(t: TestContext): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "compactd-node-test-"));
  onEnd(t, () => rm(dir, { recursive: true, force: true }));
  return dir;
}

/**
 * A daemon for this test alone (its own data dir unless one is given). When the test ends
 * the client shuts it down, and the test fails unless it exited with 0.
 */
export async function startDaemon(t: TestContext, options: SpawnOptions = {}): Promise<CompactdClient> {
  if (!existsSync(DAEMON.split(/\s+/)[0]!)) {
    throw new Error(`no daemon at ${DAEMON}: run \`make install\` at the repo root first`);
  }
  const dataDir = options.dataDir ?? (await tempDir(t));
  const client = await CompactdClient.spawn({
    command: DAEMON,
    // a hang detector, never a measure: the first call waits for the daemon to start, which on
    // a busy machine (2 shared cores at load 10) takes seconds
    requestTimeoutMs: 60_000,
    // COMPACTD_TEST_STDERR=1 (with COMPACTD_LOG_LEVEL=DEBUG) shows what the daemons say.
    stderr: process.env.COMPACTD_TEST_STDERR ? "inherit" : "pipe",
    ...options,
    dataDir,
  });
  onEnd(t, async () => {
    const code = await client.close();
    assert.equal(code, 0, `the daemon exited with ${code}; stderr:\n${client.stderr}`);
  });
  return client;
}

/** `turns` complete user/assistant turns in Anthropic format, each about `words` words long. */
export function conversation(turns: number, words = 150): Array<{ role: string; content: string }> {
  const messages = [];
  for (let i = 0; i < turns; i++) {
    messages.push({ role: "user", content: `question ${i}: ${"why does the build fail ".repeat(words / 5)}` });
    messages.push({ role: "assistant", content: `answer ${i}: ${"the cache key misses the lockfile ".repeat(words / 6)}` });
  }
  return messages;
}

/** The records of a session (from `session/get`), e.g. to see what a compaction wrote. */
export async function records(client: CompactdClient, sessionId: string): Promise<Array<{ kind: string; [key: string]: unknown }>> {
  const inspected = await client.getSession({ sessionId });
  assert.ok(Array.isArray(inspected.records), "session/get returns records");
  return inspected.records as Array<{ kind: string }>;
}
