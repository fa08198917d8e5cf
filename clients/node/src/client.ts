import { spawn, type ChildProcess } from "node:child_process";
import type { Readable, Writable } from "node:stream";
import {
  CancellationTokenSource,
  Emitter,
  ProgressType,
  ResponseError,
  StreamMessageReader,
  StreamMessageWriter,
  createMessageConnection,
  type CancellationToken,
  type Disposable,
  type MessageConnection,
} from "vscode-jsonrpc/node";
import { resolveCommand } from "./command.js";
import { CompactdError, RpcCodes, toCompactdError } from "./errors.js";
import {
  NOTIFICATION_NAMES,
  type AppendParams,
  type AppendResult,
  type BranchParams,
  type BranchResult,
  type CheckoutParams,
  type CompactParams,
  type CompactResult,
  type CompactedNotification,
  type FunctionCompleteParams,
  type FunctionStartParams,
  type FunctionStartResult,
  type GetParams,
  type HeadResult,
  type ImportParams,
  type ImportResult,
  type JsonInput,
  type JsonObject,
  type ListResult,
  type MeasureResult,
  type MethodName,
  type NotificationName,
  type Notifications,
  type OpenParams,
  type OpenResult,
  type ParamsOf,
  type RecallParams,
  type RecallResult,
  type RenderParams,
  type ReplayParams,
  type RenderResult,
  type ReportUsageParams,
  type ReportUsageResult,
  type ResultOf,
  type SessionChangedNotification,
  type SessionIdleNotification,
  type SnipParams,
  type SnipResult,
  type StatusResult,
  type SummarizeParams,
  type SummarizeResult,
  type ToolResultParams,
  type UncollapseParams,
  type UncollapseResult,
} from "./generated/protocol.js";

/** The Python client's default: long enough for a real summary call, short enough to notice a hang. */
export const DEFAULT_REQUEST_TIMEOUT_MS = 120_000;
const STDERR_TAIL_CHARS = 8_192;

export type SummaryProviderName = "anthropic" | "client" | "digest";

export interface ClientOptions {
  /** Each call fails (and is cancelled on the daemon) after this long; 0 waits forever. */
  requestTimeoutMs?: number;
}

export interface SpawnOptions extends ClientOptions {
  /** The daemon command (default `$COMPACTD_COMMAND`, else `compactd` on PATH). */
  command?: string | readonly string[];
  /** `--data-dir`, where sessions live (default `$COMPACTD_DATA_DIR` or the user data dir). */
  dataDir?: string;
  /** `--summary-provider`: `client` makes this client answer `context/summarize`. */
  summaryProvider?: SummaryProviderName;
  /** More arguments after `serve` (e.g. `["--idle-seconds", "60"]`). */
  serveArgs?: readonly string[];
  /** Added to this process's environment for the daemon. */
  env?: NodeJS.ProcessEnv;
  cwd?: string;
  /** `pipe` (default) keeps the last lines for error messages (see `stderr`). */
  stderr?: "pipe" | "inherit" | "ignore";
}

/** Answers the daemon's `context/summarize` with the agent's own model. */
export type SummarizeHandler = (
  params: SummarizeParams,
  token: CancellationToken,
) => SummarizeResult | Promise<SummarizeResult>;

/** `$/progress` values for a `workDoneToken` (LSP work-done progress). */
export interface WorkDoneProgressValue {
  kind: "begin" | "report" | "end";
  title?: string;
  message?: string;
  percentage?: number;
  cancellable?: boolean;
}

const WORK_DONE_PROGRESS = new ProgressType<WorkDoneProgressValue>();

/** Codes vscode-jsonrpc uses for a broken connection (not answers from the daemon). */
const CONNECTION_CODES: ReadonlySet<number> = new Set([
  RpcCodes.PendingResponseRejected,
  RpcCodes.ConnectionInactive,
  RpcCodes.MessageWriteError,
]);

/** The model's `compactd_recall` call, as an Anthropic `tool_use` block. */
export interface RecallToolUse {
  id: string;
  name?: string;
  input?: {
    handle?: unknown;
    startLine?: number | null;
    endLine?: number | null;
    search?: string | null;
    regex?: boolean | null;
    context?: number | null;
  };
}

/** The `tool_result` block `answerRecall` gives back, ready to append. */
export interface RecallToolResult {
  type: "tool_result";
  tool_use_id: string;
  content: string;
  is_error?: true;
}

/** A model's reply as the SDK returns it (`Message` of `@anthropic-ai/sdk`), or any message. */
export interface ReplyLike {
  type?: string;
  role?: string;
  content?: unknown;
}

/** The `tool_use` blocks of a model's reply: the calls the agent answers. */
export interface ToolUseBlock {
  type: "tool_use";
  id: string;
  name: string;
  input: Record<string, unknown>;
}

const DIRECT_CALLER = "direct";

/**
 * A message to append. A model's reply (`type: "message"`, as `@anthropic-ai/sdk` returns
 * it) becomes the assistant message it holds: its role and content only, without the
 * `caller: { type: "direct" }` the API adds to each tool_use block (the default, which a
 * request does not echo back). Anything else is sent as given.
 */
export function asMessage(message: unknown): unknown {
  const reply = message as ReplyLike | null;
  if (reply === null || typeof reply !== "object" || reply.type !== "message") return message;
  const content = Array.isArray(reply.content)
    ? reply.content.map((block: unknown) => {
        const b = block as { type?: string; caller?: { type?: string } } | null;
        if (b === null || typeof b !== "object" || b.type !== "tool_use" || b.caller?.type !== DIRECT_CALLER) {
          return block;
        }
        const { caller: _direct, ...rest } = b;
        return rest;
      })
    : reply.content;
  return { role: reply.role ?? "assistant", content };
}

/** The `tool_use` blocks of a reply (an SDK `Message` or a message object), in call order. */
export function toolUses(reply: ReplyLike | null | undefined): ToolUseBlock[] {
  const content = reply?.content;
  if (!Array.isArray(content)) return [];
  return content.filter(
    (block): block is ToolUseBlock => block !== null && typeof block === "object" && block.type === "tool_use",
  );
}

/** A recalled page as the model reads it; a cut page (or search) says where to continue. */
export function recallText(got: RecallResult): string {
  if (!got.truncated) return got.text;
  if (got.matches !== undefined && got.matches !== null) {
    return (
      `${got.text}\n[compactd: matches shown up to line ${got.endLine} of ${got.totalLines}; call ` +
      `compactd_recall with the same search and startLine=${got.endLine + 1} for the rest]`
    );
  }
  return (
    `${got.text}\n[compactd: lines ${got.startLine}–${got.endLine} of ${got.totalLines}; ` +
    `call compactd_recall with startLine=${got.endLine + 1} for more]`
  );
}

/**
 * Which client method calls each RPC method. Typed against the generated method names, so
 * the build fails when the schema gains a method this client does not offer.
 */
export const CLIENT_METHODS = {
  "session/open": "openSession",
  "session/list": "listSessions",
  "session/get": "getSession",
  "session/append": "append",
  "session/toolResult": "toolResult",
  "session/branch": "branch",
  "session/checkout": "checkout",
  "session/import": "importTranscript",
  "function/start": "functionStart",
  "function/complete": "functionComplete",
  "context/render": "render",
  "context/measure": "measure",
  "context/compact": "compact",
  "context/snip": "snip",
  "context/uncollapse": "uncollapse",
  "context/recall": "recall",
  "context/reportUsage": "reportUsage",
  "daemon/status": "status",
  "session/replay": "replay",
} as const satisfies { readonly [M in MethodName]: keyof CompactdClient };

/**
 * A connection to one compactd daemon: typed calls, notifications as events, the
 * `context/summarize` hook, and a clean `shutdown`/`exit`. Create it with `spawn` (starts
 * `compactd serve`) or `attach` (streams you already have).
 */
export class CompactdClient {
  /** The daemon process when this client spawned it. */
  readonly process: ChildProcess | undefined;
  /** Resolves with the daemon's exit code (null: killed by a signal, or not spawned by us). */
  readonly exited: Promise<number | null>;

  /** Each call fails (and is cancelled on the daemon) after this long; 0 waits forever. */
  requestTimeoutMs: number;

  private readonly connection: MessageConnection;
  private readonly emitters = new Map<NotificationName, Emitter<unknown>>();
  private summarizeHandler: SummarizeHandler | undefined;
  private stderrTail = "";
  private exitCode: number | null | undefined;
  private connectionClosed = false;
  private closing: Promise<number | null> | undefined;

  /** Start `compactd [--data-dir DIR] serve [...]` and connect to its stdio. */
  static async spawn(options: SpawnOptions = {}): Promise<CompactdClient> {
    const env = { ...process.env, ...options.env };
    const command = resolveCommand(options.command, env);
    const args = [...command.args];
    if (options.dataDir !== undefined) args.push("--data-dir", options.dataDir);
    args.push("serve");
    if (options.summaryProvider !== undefined) args.push("--summary-provider", options.summaryProvider);
    args.push(...(options.serveArgs ?? []));
    const child = spawn(command.file, args, {
      stdio: ["pipe", "pipe", options.stderr ?? "pipe"],
      env,
      cwd: options.cwd,
      windowsHide: true,
    });
    await new Promise<void>((resolve, reject) => {
      child.once("spawn", resolve);
      child.once("error", (error) =>
        reject(new Error(`cannot start the compactd daemon (${command.file}): ${error.message}`)),
      );
    });
    return new CompactdClient(child.stdout!, child.stdin!, child, options);
  }

  /** Talk to a daemon over streams you already have (a socket, a process you started). */
  static attach(input: Readable, output: Writable, options: ClientOptions = {}): CompactdClient {
    return new CompactdClient(input, output, undefined, options);
  }

  private constructor(
    input: Readable,
    output: Writable,
    child: ChildProcess | undefined,
    options: ClientOptions,
  ) {
    this.process = child;
    this.requestTimeoutMs = options.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
    this.exited = child ? this.watchProcess(child) : Promise.resolve(null);
    this.connection = createMessageConnection(
      new StreamMessageReader(input),
      new StreamMessageWriter(output),
    );
    for (const name of NOTIFICATION_NAMES) {
      const emitter = new Emitter<unknown>();
      this.emitters.set(name, emitter);
      this.connection.onNotification(name, (params: unknown) => emitter.fire(params));
    }
    this.connection.onRequest("context/summarize", (params: SummarizeParams, token) =>
      this.answerSummarize(params, token),
    );
    // A closed stream (the daemon exited) fails every pending call instead of leaving it hanging.
    this.connection.onClose(() => {
      this.connectionClosed = true;
      this.connection.dispose();
    });
    this.connection.onError(() => undefined); // write errors also reject their own call
    this.connection.listen();
  }

  private watchProcess(child: ChildProcess): Promise<number | null> {
    child.stderr?.setEncoding("utf8");
    child.stderr?.on("data", (chunk: string) => {
      this.stderrTail = (this.stderrTail + chunk).slice(-STDERR_TAIL_CHARS);
    });
    // A daemon that died must not take this process down with an EPIPE on its stdin.
    child.stdin?.on("error", () => undefined);
    return new Promise((resolve) => {
      child.once("exit", (code) => {
        this.exitCode = code;
        resolve(code);
      });
    });
  }

  /** The last lines the daemon wrote to stderr (when spawned with `stderr: "pipe"`). */
  get stderr(): string {
    return this.stderrTail;
  }

  /** Why calls fail once the daemon is gone: its exit code and the end of its stderr. */
  private goneDetail(): string | undefined {
    if (this.closing !== undefined) return "the client was closed";
    if (!this.connectionClosed && this.exitCode === undefined) return undefined;
    const parts = ["the daemon closed the connection"];
    if (this.exitCode !== undefined) parts.push(`exit code ${this.exitCode}`);
    const tail = this.stderrTail.trim().split("\n").slice(-5).join("\n");
    if (tail) parts.push(`stderr: ${tail}`);
    return parts.join("; ");
  }

  /** A failed call as a CompactdError; when the connection broke, with why the daemon went away. */
  private async failure(error: unknown, method: string): Promise<CompactdError> {
    if (error instanceof CompactdError) return error; // our own timeout
    const fromDaemon = error instanceof ResponseError && !CONNECTION_CODES.has(error.code);
    if (!fromDaemon && this.process !== undefined && this.exitCode === undefined && this.closing === undefined) {
      // The exit code and stderr arrive a moment after the broken pipe; they say what happened.
      await withTimeout(this.exited, 1_000).catch(() => undefined);
    }
    return toCompactdError(error, method, fromDaemon ? undefined : this.goneDetail());
  }

  // ---- calls ----------------------------------------------------------------------------

  /**
   * Call any method by name. Cancel through `token` (the daemon answers -32800 and the
   * promise rejects with a `CompactdError` whose `cancelled` is true); every failure is a
   * `CompactdError`.
   */
  async request<M extends MethodName>(
    method: M,
    params: ParamsOf<M>,
    token?: CancellationToken,
  ): Promise<ResultOf<M>> {
    return this.send<ResultOf<M>>(method, params, token);
  }

  private async send<R>(method: string, params: unknown, token?: CancellationToken): Promise<R> {
    const source = new CancellationTokenSource();
    const link = token?.onCancellationRequested(() => source.cancel());
    if (token?.isCancellationRequested) source.cancel();
    let timer: NodeJS.Timeout | undefined;
    try {
      const answer = this.connection.sendRequest<R>(method, params, source.token);
      if (this.requestTimeoutMs <= 0) return await answer;
      const timeout = new Promise<never>((_, reject) => {
        timer = setTimeout(() => {
          source.cancel();
          reject(
            new CompactdError(
              RpcCodes.RequestCancelled,
              `no answer within ${this.requestTimeoutMs} ms; the request was cancelled`,
              { kind: "timeout", timeoutMs: this.requestTimeoutMs },
              method,
            ),
          );
        }, this.requestTimeoutMs);
      });
      return await Promise.race([answer, timeout]);
    } catch (error) {
      throw await this.failure(error, method);
    } finally {
      clearTimeout(timer);
      link?.dispose();
      source.dispose();
    }
  }

  // ---- typed methods (one per schema method; see CLIENT_METHODS) ------------------------

  /** Open a session, creating it when needed (a new id when none is given). */
  openSession(params: OpenParams = {}, token?: CancellationToken): Promise<OpenResult> {
    return this.request("session/open", params, token);
  }

  listSessions(token?: CancellationToken): Promise<ListResult> {
    return this.request("session/list", {}, token);
  }

  /** Inspect a session (its branch path and records) or one node with its children. */
  getSession(params: GetParams, token?: CancellationToken): Promise<JsonObject> {
    return this.request("session/get", params, token);
  }

  /**
   * Append provider-format `messages` (or raw `nodes`); `expectedHead` guards against races.
   * A message may be the SDK's reply itself (`messages: [reply]`): its role and content go in.
   */
  append(params: AppendParams, token?: CancellationToken): Promise<AppendResult> {
    const messages = params.messages?.map((message) => asMessage(message) as JsonInput);
    return this.request("session/append", messages ? { ...params, messages } : params, token);
  }

  toolResult(params: ToolResultParams, token?: CancellationToken): Promise<HeadResult> {
    return this.request("session/toolResult", params, token);
  }

  branch(params: BranchParams, token?: CancellationToken): Promise<BranchResult> {
    return this.request("session/branch", params, token);
  }

  checkout(params: CheckoutParams, token?: CancellationToken): Promise<BranchResult> {
    return this.request("session/checkout", params, token);
  }

  /** Import a transcript file the daemon can read; one session per conversation in it. */
  importTranscript(params: ImportParams, token?: CancellationToken): Promise<ImportResult> {
    return this.request("session/import", params, token);
  }

  functionStart(params: FunctionStartParams, token?: CancellationToken): Promise<FunctionStartResult> {
    return this.request("function/start", params, token);
  }

  functionComplete(params: FunctionCompleteParams, token?: CancellationToken): Promise<HeadResult> {
    return this.request("function/complete", params, token);
  }

  /** The provider request body for the next model call (with `cascade`, compacting first; with
   * `dryRun` too, a preview that writes nothing). */
  render(params: RenderParams, token?: CancellationToken): Promise<RenderResult> {
    return this.request("context/render", params, token);
  }

  /** What the next request would cost, by category, without remembering anything. */
  measure(params: RenderParams, token?: CancellationToken): Promise<MeasureResult> {
    return this.request("context/measure", params, token);
  }

  /** `/compact`: summarize now. Long: pass a token to cancel, a `workDoneToken` for progress. */
  compact(params: CompactParams, token?: CancellationToken): Promise<CompactResult> {
    return this.request("context/compact", params, token);
  }

  snip(params: SnipParams, token?: CancellationToken): Promise<SnipResult> {
    return this.request("context/snip", params, token);
  }

  uncollapse(params: UncollapseParams, token?: CancellationToken): Promise<UncollapseResult> {
    return this.request("context/uncollapse", params, token);
  }

  /** Lines of what a recall handle (named in a marker of a `recall: true` render) stands for. */
  recall(params: RecallParams, token?: CancellationToken): Promise<RecallResult> {
    return this.request("context/recall", params, token);
  }

  /**
   * The `tool_result` block answering the model's `compactd_recall` call, in one line: the
   * recalled lines or a search's matches, with a note on where to continue when they were cut.
   * A bad handle, line or search is the model's mistake, so it comes back as an error result
   * the model can read.
   */
  async answerRecall(sessionId: string, toolUse: RecallToolUse): Promise<RecallToolResult> {
    const input = toolUse.input ?? {};
    try {
      const got = await this.recall({
        sessionId,
        handle: String(input.handle ?? ""),
        startLine: input.startLine ?? null,
        endLine: input.endLine ?? null,
        search: input.search ?? null,
        regex: input.regex ?? null,
        context: input.context ?? null,
      });
      return { type: "tool_result", tool_use_id: toolUse.id, content: recallText(got) };
    } catch (error) {
      if (!(error instanceof CompactdError) || CONNECTION_CODES.has(error.code)) throw error;
      return { type: "tool_result", tool_use_id: toolUse.id, content: error.message, is_error: true };
    }
  }

  /** What the provider said about the last request: usage, applied edits, or its error. */
  reportUsage(params: ReportUsageParams, token?: CancellationToken): Promise<ReportUsageResult> {
    return this.request("context/reportUsage", params, token);
  }

  /**
   * Relive a transcript under the cascade in a scratch store (nothing is kept) and price
   * every request with the provider's cache rules. Long: takes a token and a `workDoneToken`.
   */
  replay(params: ReplayParams, token?: CancellationToken): Promise<JsonObject> {
    return this.request("session/replay", params, token);
  }

  status(token?: CancellationToken): Promise<StatusResult> {
    return this.request("daemon/status", {}, token);
  }

  // ---- notifications and the daemon's requests --------------------------------------------

  /** Listen to one of the daemon's notifications; dispose the result to stop. */
  onNotification<N extends NotificationName>(
    name: N,
    listener: (params: Notifications[N]) => void,
  ): Disposable {
    const emitter = this.emitters.get(name);
    if (emitter === undefined) throw new Error(`unknown notification ${name}`);
    return emitter.event(listener as (params: unknown) => void);
  }

  /** A tier changed the context (or tried and said why not). */
  onCompacted(listener: (params: CompactedNotification) => void): Disposable {
    return this.onNotification("context/compacted", listener);
  }

  /** Another process appended to a session this daemon has loaded. */
  onSessionChanged(listener: (params: SessionChangedNotification) => void): Disposable {
    return this.onNotification("session/changed", listener);
  }

  /** A session went idle and time-based microcompact ran. */
  onSessionIdle(listener: (params: SessionIdleNotification) => void): Disposable {
    return this.onNotification("session/idle", listener);
  }

  /** The next `name` notification that satisfies `accept`, or a rejection after `timeoutMs`. */
  nextNotification<N extends NotificationName>(
    name: N,
    accept: (params: Notifications[N]) => boolean = () => true,
    timeoutMs = 10_000,
  ): Promise<Notifications[N]> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        subscription.dispose();
        reject(new Error(`no ${name} notification within ${timeoutMs} ms`));
      }, timeoutMs);
      const subscription = this.onNotification(name, (params) => {
        if (!accept(params)) return;
        clearTimeout(timer);
        subscription.dispose();
        resolve(params);
      });
    });
  }

  /** Progress of a call made with this `workDoneToken` (e.g. `compact`). */
  onProgress(workDoneToken: string, listener: (value: WorkDoneProgressValue) => void): Disposable {
    return this.connection.onProgress(WORK_DONE_PROGRESS, workDoneToken, listener);
  }

  /**
   * Be the `client` summary provider (daemon started with `--summary-provider client`):
   * `handler` gets the daemon's prompt and returns `{text}` from the agent's own model. Its
   * token is cancelled when the daemon gives up (the compact was cancelled or timed out).
   */
  onSummarize(handler: SummarizeHandler): Disposable {
    this.summarizeHandler = handler;
    return {
      dispose: () => {
        if (this.summarizeHandler === handler) this.summarizeHandler = undefined;
      },
    };
  }

  private async answerSummarize(
    params: SummarizeParams,
    token: CancellationToken,
  ): Promise<SummarizeResult | ResponseError> {
    const handler = this.summarizeHandler;
    if (handler === undefined) {
      return new ResponseError(
        RpcCodes.MethodNotFound,
        "this client has no context/summarize handler (register one with onSummarize)",
      );
    }
    try {
      const result = await handler(params, token);
      if (result === null || typeof result !== "object" || typeof result.text !== "string") {
        return new ResponseError(RpcCodes.InternalError, "the summarize handler returned no {text}");
      }
      return result;
    } catch (error) {
      if (error instanceof ResponseError) return error;
      const message = error instanceof Error ? error.message : String(error);
      return new ResponseError(RpcCodes.InternalError, `the summarize handler failed: ${message}`);
    }
  }

  // ---- ending --------------------------------------------------------------------------------

  /**
   * `shutdown`, then `exit`, then wait for the daemon to end (killing it after `timeoutMs`).
   * Resolves with its exit code (0 after a clean shutdown), or null for attached streams.
   */
  close(timeoutMs = 10_000): Promise<number | null> {
    this.closing ??= this.shutdownAndExit(timeoutMs);
    return this.closing;
  }

  private async shutdownAndExit(timeoutMs: number): Promise<number | null> {
    if (!this.connectionClosed) {
      try {
        await withTimeout(this.connection.sendRequest("shutdown"), timeoutMs);
        await this.connection.sendNotification("exit");
      } catch {
        // The daemon is already gone or stuck; the process wait below deals with both.
      }
    }
    let code: number | null = null;
    if (this.process !== undefined) {
      const ended = await withTimeout(this.exited, timeoutMs).then(
        () => true,
        () => false,
      );
      if (!ended) this.process.kill("SIGKILL");
      code = await this.exited;
    } else {
      this.connection.end();
    }
    this.connection.dispose();
    for (const emitter of this.emitters.values()) emitter.dispose();
    return code;
  }
}

function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}
