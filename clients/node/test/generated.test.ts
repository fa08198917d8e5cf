// The generated types are a function of protocol/schema.json: the committed copies must be
// exactly what the generator produces now, and the client must cover every schema method.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { test } from "node:test";
import { pathToFileURL } from "node:url";
import { CLIENT_METHODS, CompactdClient, ERROR_CODES, METHOD_NAMES, NOTIFICATION_NAMES } from "@compactd/client";
import { PACKAGE_DIR, REPO_DIR } from "./helpers.js";

interface Generator {
  generate(schema: unknown, options?: { source?: string }): string;
  generateFromFile(path?: string): string;
  DEFAULT_OUTS: string[];
}

const SCHEMA_PATH = resolve(REPO_DIR, "protocol/schema.json");
const schema = JSON.parse(readFileSync(SCHEMA_PATH, "utf8")) as {
  methods: Record<string, unknown>;
  notifications: Record<string, unknown>;
  errors: Record<string, { code: number }>;
};

function loadGenerator(): Promise<Generator> {
  return import(pathToFileURL(resolve(PACKAGE_DIR, "scripts/gen-types.mjs")).href) as Promise<Generator>;
}

test("the committed generated files are up to date with protocol/schema.json", async () => {
  const generator = await loadGenerator();
  const expected = generator.generateFromFile(SCHEMA_PATH);
  assert.equal(generator.DEFAULT_OUTS.length, 2);
  for (const path of generator.DEFAULT_OUTS) {
    const committed = readFileSync(path, "utf8");
    assert.ok(committed === expected, `${path} is stale: run \`npm run gen\` in clients/node and commit the result`);
  }
});

test("the client has a method for every schema method, and the names match", () => {
  assert.deepEqual([...METHOD_NAMES].sort(), Object.keys(schema.methods).sort());
  assert.deepEqual(Object.keys(CLIENT_METHODS).sort(), Object.keys(schema.methods).sort());
  for (const [wire, name] of Object.entries(CLIENT_METHODS)) {
    assert.equal(typeof CompactdClient.prototype[name], "function", `${wire} → ${name}`);
  }
  assert.deepEqual([...NOTIFICATION_NAMES].sort(), Object.keys(schema.notifications).sort());
});

test("error codes are the schema's", () => {
  const fromSchema = Object.fromEntries(Object.entries(schema.errors).map(([kind, e]) => [kind, e.code]));
  assert.deepEqual({ ...ERROR_CODES }, fromSchema);
});

test("the generator maps schema constructs to TypeScript", async () => {
  const { generate } = await loadGenerator();
  const text = generate({
    version: 9,
    methods: { "x/do": { params: { $ref: "#/$defs/DoParams" }, result: { type: "object" } } },
    notifications: {},
    serverRequests: {},
    errors: { oops: { code: 4999, description: "It broke." } },
    $defs: {
      DoParams: {
        type: "object",
        description: "Do a thing.",
        properties: {
          id: { type: "string" },
          mode: { enum: ["a", "b"], default: "a" },
          maybe: { anyOf: [{ type: "integer" }, { type: "null" }], default: null },
          list: { type: "array", items: { anyOf: [{ type: "string" }, { type: "number" }] } },
          map: { type: "object", additionalProperties: { type: "boolean" } },
          blob: { type: "object" },
          any: {},
        },
        required: ["id", "list"],
      },
      Empty: { type: "object", properties: {} },
    },
  });
  assert.match(text, /\/\*\* Do a thing\. \*\/\nexport interface DoParams \{/);
  assert.match(text, /\n  id: string;/);
  assert.match(text, /\n  mode\?: "a" \| "b";/);
  assert.match(text, /\n  maybe\?: number \| null;/);
  assert.match(text, /\n  list: Array<string \| number>;/);
  assert.match(text, /\n  map\?: \{ \[key: string\]: boolean \};/);
  assert.match(text, /\n  blob\?: JsonInput;/); // sent by the client: interface-typed values fit
  assert.match(text, /\n  any\?: unknown;/);
  assert.match(text, /export type Empty = Record<string, never>;/);
  assert.match(text, /"x\/do": \{ params: DoParams; result: JsonObject \};/);
  assert.match(text, /oops: 4999,/);
  assert.match(text, /SCHEMA_VERSION = 9;/);
  assert.throws(() => generate({ $defs: { Bad: { type: "tuple" } } }), /unsupported schema type/);
  assert.throws(() => generate({ $defs: { Bad: { $ref: "http://elsewhere#/x" } } }), /unsupported \$ref/);
});
