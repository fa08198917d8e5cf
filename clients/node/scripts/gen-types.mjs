#!/usr/bin/env node
// Generates TypeScript types for the compactd RPC surface from protocol/schema.json.
//
// The schema is the one contract between the Python daemon and every other client, so the
// TypeScript types are derived from it rather than written by hand: `npm run gen` rewrites
// src/generated/protocol.ts here and in the VS Code extension (clients/vscode), and a test
// fails when a committed copy differs from what this script would produce now. Plain Node,
// no dependencies, so it runs before `npm ci` too.
//
// Usage: node scripts/gen-types.mjs [--schema PATH] [--out PATH]... [--check]
//   --out    write only there (repeatable); default: both packages' src/generated/protocol.ts
//   --check  exit 1 (writing nothing) when an output file is not up to date.

import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, relative, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const HERE = dirname(fileURLToPath(import.meta.url));
export const PACKAGE_DIR = resolve(HERE, "..");
export const DEFAULT_SCHEMA = resolve(PACKAGE_DIR, "../../protocol/schema.json");
/** The committed copies: this package's and the VS Code extension's (which has no build-time
 * dependency on this package, so it carries its own). */
export const DEFAULT_OUTS = [
  resolve(PACKAGE_DIR, "src/generated/protocol.ts"),
  resolve(PACKAGE_DIR, "../vscode/src/generated/protocol.ts"),
];

/** A JSON object the daemon sends: read its fields after narrowing them. */
const RECEIVED_OBJECT = "JsonObject";
/** A JSON object the client sends: accepts interface-typed values (an SDK's message types). */
const SENT_OBJECT = "JsonInput";

const SIMPLE_TYPE = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** The name a local `$ref` points at (`#/$defs/Name` → `Name`). */
function refName(ref) {
  const match = /^#\/\$defs\/([A-Za-z_][A-Za-z0-9_]*)$/.exec(ref);
  if (!match) throw new Error(`unsupported $ref ${JSON.stringify(ref)} (only #/$defs/Name)`);
  return match[1];
}

/** Every `$defs` name reachable from `node`, following refs. */
function reachable(node, defs, seen = new Set()) {
  if (Array.isArray(node)) {
    for (const item of node) reachable(item, defs, seen);
  } else if (node && typeof node === "object") {
    if (typeof node.$ref === "string") {
      const name = refName(node.$ref);
      if (!seen.has(name)) {
        seen.add(name);
        reachable(defs[name], defs, seen);
      }
    }
    for (const [key, value] of Object.entries(node)) {
      if (key !== "$ref") reachable(value, defs, seen);
    }
  }
  return seen;
}

function union(parts) {
  const unique = [...new Set(parts)];
  return unique.join(" | ");
}

function arrayOf(item) {
  return SIMPLE_TYPE.test(item) ? `${item}[]` : `Array<${item}>`;
}

function quoteKey(key) {
  return SIMPLE_TYPE.test(key) ? key : JSON.stringify(key);
}

/** Doc comment lines (already indented) for a schema node, or none. */
function docLines(node, indent) {
  const parts = [];
  if (typeof node.description === "string") parts.push(node.description);
  if ("default" in node) parts.push(`Default: \`${JSON.stringify(node.default)}\` (may be omitted).`);
  if (parts.length === 0) return [];
  const text = parts.join(" ").replace(/\*\//g, "*\\/");
  return [`${indent}/** ${text} */`];
}

/** The TypeScript type of a schema node; `objectAlias` names untyped JSON objects. */
function tsType(node, objectAlias, indent) {
  if (node === true || (node && typeof node === "object" && Object.keys(node).every((k) => k === "default" || k === "description"))) {
    return "unknown";
  }
  if (!node || typeof node !== "object") throw new Error(`unsupported schema node ${JSON.stringify(node)}`);
  if (typeof node.$ref === "string") return refName(node.$ref);
  if (Array.isArray(node.anyOf) || Array.isArray(node.oneOf)) {
    return union((node.anyOf ?? node.oneOf).map((option) => tsType(option, objectAlias, indent)));
  }
  if (Array.isArray(node.enum)) return union(node.enum.map((value) => JSON.stringify(value)));
  if ("const" in node) return JSON.stringify(node.const);
  if (Array.isArray(node.type)) {
    return union(node.type.map((type) => tsType({ ...node, type }, objectAlias, indent)));
  }
  switch (node.type) {
    case "string":
      return "string";
    case "integer":
    case "number":
      return "number";
    case "boolean":
      return "boolean";
    case "null":
      return "null";
    case "array":
      return arrayOf(node.items === undefined ? "unknown" : tsType(node.items, objectAlias, indent));
    case "object":
      return objectType(node, objectAlias, indent);
    default:
      throw new Error(`unsupported schema type ${JSON.stringify(node.type)}`);
  }
}

function objectType(node, objectAlias, indent) {
  const props = node.properties ?? {};
  const names = Object.keys(props);
  if (names.length === 0) {
    if (node.additionalProperties && typeof node.additionalProperties === "object") {
      return `{ [key: string]: ${tsType(node.additionalProperties, objectAlias, indent)} }`;
    }
    if ("properties" in node) return "Record<string, never>";
    return objectAlias;
  }
  return `{\n${members(node, objectAlias, indent + "  ").join("\n")}\n${indent}}`;
}

/** The member lines of an object with `properties`: optional = not in `required`. */
function members(node, objectAlias, indent) {
  const required = new Set(node.required ?? []);
  const lines = [];
  for (const [name, prop] of Object.entries(node.properties)) {
    lines.push(...docLines(prop, indent));
    const optional = required.has(name) ? "" : "?";
    lines.push(`${indent}${quoteKey(name)}${optional}: ${tsType(prop, objectAlias, indent)};`);
  }
  return lines;
}

function definition(name, node, objectAlias) {
  const lines = docLines({ description: node.description }, "");
  const isPlainObject =
    node.type === "object" && node.properties && Object.keys(node.properties).length > 0;
  if (isPlainObject) {
    lines.push(`export interface ${name} {`, ...members(node, objectAlias, "  "), "}");
  } else {
    lines.push(`export type ${name} = ${tsType(node, objectAlias, "")};`);
  }
  return lines.join("\n");
}

function stringList(name, typeName, values) {
  const items = values.map((v) => `  ${JSON.stringify(v)},`).join("\n");
  return `export const ${name} = [\n${items}\n] as const satisfies readonly ${typeName}[];`;
}

/** The whole generated module for `schema`, as text (deterministic: schema order). */
export function generate(schema, { source = "protocol/schema.json" } = {}) {
  const defs = schema.$defs ?? {};
  const methods = schema.methods ?? {};
  const notifications = schema.notifications ?? {};
  const serverRequests = schema.serverRequests ?? {};
  const errors = schema.errors ?? {};

  // Which defs the daemon sends and which the client sends decides how loose a bare
  // `{type: object}` is: strict (`unknown` values) to read, interface-friendly to write.
  const received = reachable(
    [
      Object.values(methods).map((m) => m.result),
      Object.values(notifications).map((n) => n.params),
      Object.values(serverRequests).map((r) => r.params),
    ],
    defs,
  );
  const aliasFor = (name) => (received.has(name) ? RECEIVED_OBJECT : SENT_OBJECT);

  const out = [];
  out.push(
    `// Generated by scripts/gen-types.mjs from ${source} (schema version ${schema.version}).`,
    "// Do not edit: run `npm run gen` in clients/node after the schema changes.",
    "/* eslint-disable */",
    "",
    `/** Version of the schema these types were generated from. */`,
    `export const SCHEMA_VERSION = ${JSON.stringify(schema.version)};`,
    "",
    "/** A JSON object the daemon sends whose shape the schema leaves open. */",
    `export type ${RECEIVED_OBJECT} = { [key: string]: unknown };`,
    "",
    "/** A JSON object the client sends whose shape the schema leaves open (any object type fits). */",
    `export type ${SENT_OBJECT} = { readonly [key: string]: any };`,
    "",
  );

  for (const [name, node] of Object.entries(defs)) {
    out.push(definition(name, node, aliasFor(name)), "");
  }

  out.push("/** Every client → daemon method: its params and its result. */", "export interface Methods {");
  for (const [name, method] of Object.entries(methods)) {
    const params = tsType(method.params, SENT_OBJECT, "  ");
    const result = tsType(method.result, RECEIVED_OBJECT, "  ");
    out.push(`  ${JSON.stringify(name)}: { params: ${params}; result: ${result} };`);
  }
  out.push(
    "}",
    "",
    "export type MethodName = keyof Methods;",
    "export type ParamsOf<M extends MethodName> = Methods[M][\"params\"];",
    "export type ResultOf<M extends MethodName> = Methods[M][\"result\"];",
    stringList("METHOD_NAMES", "MethodName", Object.keys(methods)),
    "",
  );

  out.push("/** Every daemon → client notification and its params. */", "export interface Notifications {");
  for (const [name, note] of Object.entries(notifications)) {
    out.push(`  ${JSON.stringify(name)}: ${tsType(note.params, RECEIVED_OBJECT, "  ")};`);
  }
  out.push(
    "}",
    "",
    "export type NotificationName = keyof Notifications;",
    stringList("NOTIFICATION_NAMES", "NotificationName", Object.keys(notifications)),
    "",
  );

  out.push("/** Requests the daemon sends to its client, and what the client answers. */", "export interface ServerRequests {");
  for (const [name, request] of Object.entries(serverRequests)) {
    const params = tsType(request.params, RECEIVED_OBJECT, "  ");
    const result = tsType(request.result, SENT_OBJECT, "  ");
    out.push(`  ${JSON.stringify(name)}: { params: ${params}; result: ${result} };`);
  }
  out.push(
    "}",
    "",
    "export type ServerRequestName = keyof ServerRequests;",
    stringList("SERVER_REQUEST_NAMES", "ServerRequestName", Object.keys(serverRequests)),
    "",
  );

  out.push("/** compactd's own error codes by kind (`error.data.kind` names the same thing). */", "export const ERROR_CODES = {");
  for (const [kind, error] of Object.entries(errors)) {
    out.push(`  /** ${String(error.description).replace(/\*\//g, "*\\/")} */`, `  ${quoteKey(kind)}: ${error.code},`);
  }
  out.push(
    "} as const;",
    "",
    "export type ErrorKind = keyof typeof ERROR_CODES;",
    "",
    "/** What each compactd error means, for messages shown to a person. */",
    "export const ERROR_DESCRIPTIONS: { readonly [K in ErrorKind]: string } = {",
  );
  for (const [kind, error] of Object.entries(errors)) {
    out.push(`  ${quoteKey(kind)}: ${JSON.stringify(error.description)},`);
  }
  out.push("};", "");

  return out.join("\n");
}

export function readSchema(path = DEFAULT_SCHEMA) {
  return JSON.parse(readFileSync(path, "utf8"));
}

/** The generated text for a schema file, with its path written relative to the repo root. */
export function generateFromFile(schemaPath = DEFAULT_SCHEMA) {
  const repoRoot = resolve(PACKAGE_DIR, "../..");
  const source = relative(repoRoot, resolve(schemaPath)).split("\\").join("/");
  return generate(readSchema(schemaPath), { source });
}

function parseArgs(argv) {
  const options = { schema: DEFAULT_SCHEMA, outs: [], check: false };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const value = () => {
      const next = argv[++i];
      if (next === undefined) throw new Error(`${arg} needs a path`);
      return resolve(next);
    };
    if (arg === "--check") options.check = true;
    else if (arg === "--schema") options.schema = value();
    else if (arg === "--out") options.outs.push(value());
    else throw new Error(`unknown argument ${arg}`);
  }
  if (options.outs.length === 0) options.outs = DEFAULT_OUTS;
  return options;
}

function main() {
  const options = parseArgs(process.argv.slice(2));
  const text = generateFromFile(options.schema);
  let stale = false;
  for (const out of options.outs) {
    const current = existsSync(out) ? readFileSync(out, "utf8") : null;
    if (current === text) continue;
    if (options.check) {
      console.error(`${out} is stale: run \`npm run gen\` in clients/node`);
      stale = true;
      continue;
    }
    mkdirSync(dirname(out), { recursive: true });
    writeFileSync(out, text);
    console.log(`wrote ${relative(process.cwd(), out)}`);
  }
  if (stale) process.exit(1);
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  main();
}
