/**
 * @compactd/client — talk to the compactd daemon from Node: spawn `compactd serve` (or attach
 * to streams), call its methods with types generated from protocol/schema.json, listen to its
 * notifications, and answer its `context/summarize` requests.
 */
export {
  CLIENT_METHODS,
  CompactdClient,
  DEFAULT_REQUEST_TIMEOUT_MS,
  asMessage,
  recallText,
  toolUses,
  type ReplyLike,
  type ToolUseBlock,
  type RecallToolResult,
  type RecallToolUse,
  type ClientOptions,
  type SpawnOptions,
  type SummarizeHandler,
  type SummaryProviderName,
  type WorkDoneProgressValue,
} from "./client.js";
export { COMMAND_ENV, findOnPath, resolveCommand, type DaemonCommand } from "./command.js";
export { CompactdError, RpcCodes, toCompactdError, type CompactdErrorKind } from "./errors.js";
export * from "./generated/protocol.js";
export { CancellationToken, CancellationTokenSource, type Disposable } from "vscode-jsonrpc/node";
