/**
 * What the extension shows, as pure functions of the daemon's answers. Nothing here imports
 * `vscode`, so the logic is tested with plain `node --test` (no editor on CI); extension.ts
 * only wires these to the status bar, the quick pick and the commands.
 */
import type { CompactResult, ListResult, MeasureResult } from "./generated/protocol.js";

/** How loud the status bar item should be. */
export type Severity = "normal" | "warning" | "error";

export interface StatusView {
  text: string;
  tooltip: string;
  severity: Severity;
}

export interface ContextItem {
  label: string;
  description: string;
  detail?: string;
}

/** Display names for the categories `context/measure` reports (unknown ones are shown as sent). */
const CATEGORY_LABELS: { readonly [category: string]: string } = {
  system: "System prompt",
  tools: "Tool definitions",
  schema: "Response schema",
  user: "User messages",
  assistant: "Assistant messages",
  thinking: "Thinking",
  tool_calls: "Tool calls",
  tool_results: "Tool results",
  markers: "Compaction markers",
  output_reserve: "Reserved for output",
  free: "Free",
};

/** Kept last in the panel: they are room, not content. */
const ROOM_CATEGORIES = new Set(["output_reserve", "free"]);

/**
 * The session the extension follows: the `compactd.sessionId` setting when set, else the
 * most recently modified session, else none.
 */
export function chooseSession(setting: string | undefined, list: ListResult | undefined): string | undefined {
  const configured = setting?.trim();
  if (configured) return configured;
  const sessions = list?.sessions ?? [];
  let best: (typeof sessions)[number] | undefined;
  for (const session of sessions) {
    if (best === undefined || session.modified > best.modified) best = session;
  }
  return best?.sessionId;
}

/** 1234 → "1.2k", 1234567 → "1.2M": short enough for a status bar. */
export function formatTokens(tokens: number): string {
  const abs = Math.abs(tokens);
  if (abs < 1000) return String(Math.round(tokens));
  if (abs < 1_000_000) return `${trimZero((tokens / 1000).toFixed(abs < 10_000 ? 1 : 0))}k`;
  return `${trimZero((tokens / 1_000_000).toFixed(1))}M`;
}

function trimZero(text: string): string {
  return text.replace(/\.0$/, "");
}

/** `part` as a whole percentage of `whole` (0 when there is no whole). */
export function percent(part: number, whole: number): number {
  if (!(whole > 0)) return 0;
  return Math.round((part / whole) * 100);
}

/**
 * The status bar for a measure: occupancy of the input limit (window minus the output
 * reserve), since that is what a request can actually fill; a warning once the cascade's
 * threshold is passed and an error at the limit.
 */
export function statusView(measure: MeasureResult, sessionId?: string): StatusView {
  const used = percent(measure.total, measure.limit);
  const severity: Severity =
    measure.total >= measure.limit ? "error" : measure.total >= measure.threshold ? "warning" : "normal";
  const lines = [
    `compactd${sessionId ? ` — session ${sessionId}` : ""}`,
    `${measure.total.toLocaleString("en-US")} of ${measure.limit.toLocaleString("en-US")} input tokens (${used}%)`,
    `window ${measure.window.toLocaleString("en-US")}, ${measure.outputReserve.toLocaleString("en-US")} reserved for output`,
    `compaction starts at ${measure.threshold.toLocaleString("en-US")}`,
    `${measure.turnsShown} of ${measure.turns} turns shown`,
  ];
  if (measure.advice) lines.push(measure.advice);
  return { text: `ctx ${used}%`, tooltip: lines.join("\n"), severity };
}

/** The status bar when there is nothing to measure yet (no daemon, no session). */
export function idleStatusView(reason: string): StatusView {
  return { text: "ctx —", tooltip: `compactd: ${reason}`, severity: "normal" };
}

/** A text bar of `width` cells for a share of the window. */
export function bar(part: number, whole: number, width = 20): string {
  const filled = whole > 0 ? Math.min(width, Math.round((part / whole) * width)) : 0;
  return "█".repeat(filled) + "░".repeat(width - filled);
}

/**
 * The context panel as quick-pick items: the content categories largest first, then the
 * output reserve and the free room; empty categories are left out.
 */
export function contextItems(measure: MeasureResult): ContextItem[] {
  const entries = Object.entries(measure.categories).filter(([, tokens]) => tokens > 0);
  const content = entries.filter(([name]) => !ROOM_CATEGORIES.has(name)).sort((a, b) => b[1] - a[1]);
  const room = entries.filter(([name]) => ROOM_CATEGORIES.has(name));
  const items = [...content, ...room].map(([name, tokens]) => ({
    label: CATEGORY_LABELS[name] ?? name,
    description: `${formatTokens(tokens)} tokens · ${percent(tokens, measure.window)}%`,
    detail: bar(tokens, measure.window),
  }));
  const summary: ContextItem = {
    label: `Total ${formatTokens(measure.total)} / ${formatTokens(measure.limit)}`,
    description: `${percent(measure.total, measure.limit)}% of the input limit`,
    detail: `${measure.turnsShown} of ${measure.turns} turns shown${measure.advice ? ` — ${measure.advice}` : ""}`,
  };
  return [summary, ...items];
}

/** The same panel as plain text lines (for the output channel). */
export function contextLines(measure: MeasureResult): string[] {
  return contextItems(measure).map((item) =>
    [item.label.padEnd(24), item.description, item.detail ?? ""].join("  ").trimEnd(),
  );
}

/** What to tell the user after `context/compact`. */
export function compactMessage(result: CompactResult): string {
  if (!result.applied) return `compactd: not compacted — ${result.reason ?? "no reason given"}`;
  const turns = result.coveredTurns === 1 ? "1 turn" : `${result.coveredTurns} turns`;
  const saved = result.tokensBefore - result.tokensAfter;
  return (
    `compactd: summarized ${turns}: ${formatTokens(result.tokensBefore)} → ` +
    `${formatTokens(result.tokensAfter)} tokens (${formatTokens(saved)} saved)`
  );
}

/** The `compact` instructions from the input box: blank means none, Escape means cancel. */
export function instructionsFrom(input: string | undefined): { cancelled: boolean; instructions?: string } {
  if (input === undefined) return { cancelled: true };
  const text = input.trim();
  return text ? { cancelled: false, instructions: text } : { cancelled: false };
}

/**
 * The daemon command: the `compactd.command` setting, else `$COMPACTD_COMMAND`, else
 * `compactd` (found on PATH when the process starts). Split on whitespace, so
 * `python -m compactd` works; a path with spaces belongs in the setting alone.
 */
export function daemonCommand(
  setting: string | undefined,
  envCommand: string | undefined,
): { command: string; args: string[] } {
  const text = setting?.trim() || envCommand?.trim() || "compactd";
  const [command = "compactd", ...args] = text.split(/\s+/);
  return { command, args };
}

/** Arguments for `compactd [--data-dir DIR] serve [--summary-provider P]` (data dir before `serve`). */
export function serveArgs(options: { dataDir?: string; summaryProvider?: string }): string[] {
  const args: string[] = [];
  if (options.dataDir?.trim()) args.push("--data-dir", options.dataDir.trim());
  args.push("serve");
  if (options.summaryProvider?.trim()) args.push("--summary-provider", options.summaryProvider.trim());
  return args;
}

/** A failed call as one line for a notification: compactd's message, with its kind when known. */
export function errorMessage(error: unknown): string {
  if (error !== null && typeof error === "object") {
    const { message, data } = error as { message?: unknown; data?: unknown };
    const kind =
      data !== null && typeof data === "object" ? (data as { kind?: unknown }).kind : undefined;
    const text = typeof message === "string" ? message : String(error);
    return typeof kind === "string" ? `compactd (${kind}): ${text}` : `compactd: ${text}`;
  }
  return `compactd: ${String(error)}`;
}

/**
 * Why the daemon did not start, said so the user can fix it: a command that is not there
 * (spawn's ENOENT — `compactd` lives in a virtualenv, not on PATH) names the setting to set.
 */
export function startFailureMessage(error: unknown, command: string): string {
  const code = error !== null && typeof error === "object" ? (error as { code?: unknown }).code : undefined;
  const text = errorMessage(error);
  if (code === "ENOENT" || /ENOENT|not found/i.test(text)) {
    return `compactd: daemon not found (\`${command}\`) — set \`compactd.command\` to its path, e.g. /path/to/.venv/bin/compactd`;
  }
  return `compactd: the daemon did not start (${text.replace(/^compactd: /, "")})`;
}
