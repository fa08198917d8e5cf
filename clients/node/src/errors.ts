import { ResponseError } from "vscode-jsonrpc/node";
import { ERROR_CODES, type ErrorKind } from "./generated/protocol.js";

/** JSON-RPC and LSP codes the daemon (or vscode-jsonrpc itself) answers with. */
export const RpcCodes = {
  ParseError: -32700,
  InvalidRequest: -32600,
  MethodNotFound: -32601,
  InvalidParams: -32602,
  InternalError: -32603,
  /** The request was cancelled (`$/cancelRequest`, or this client's timeout). */
  RequestCancelled: -32800,
  /** vscode-jsonrpc: the connection closed before the answer came. */
  PendingResponseRejected: -32097,
  /** vscode-jsonrpc: the connection is no longer usable. */
  ConnectionInactive: -32096,
  /** vscode-jsonrpc: the request could not be written to the daemon. */
  MessageWriteError: -32099,
} as const;

/** Names for the standard codes, so every error has a `kind` to switch on. */
const STANDARD_KINDS: { readonly [code: number]: string } = {
  [RpcCodes.ParseError]: "parse_error",
  [RpcCodes.InvalidRequest]: "invalid_request",
  [RpcCodes.MethodNotFound]: "method_not_found",
  [RpcCodes.InvalidParams]: "invalid_params",
  [RpcCodes.InternalError]: "internal_error",
  [RpcCodes.RequestCancelled]: "request_cancelled",
  [RpcCodes.PendingResponseRejected]: "connection_closed",
  [RpcCodes.ConnectionInactive]: "connection_closed",
  [RpcCodes.MessageWriteError]: "connection_closed",
};

const KIND_BY_CODE: ReadonlyMap<number, ErrorKind> = new Map(
  (Object.entries(ERROR_CODES) as [ErrorKind, number][]).map(([kind, code]) => [code, kind]),
);

/** A kind this client knows: compactd's own, a standard JSON-RPC one, or `timeout`. */
export type CompactdErrorKind = ErrorKind | (string & {});

/**
 * An error answer from the daemon (or a failed connection), with the fields a caller
 * branches on: `code` (see `ERROR_CODES` / `RpcCodes`), `kind` (`data.kind` when the daemon
 * sent one, else the name of the code) and the structured `data`.
 */
export class CompactdError extends Error {
  override readonly name = "CompactdError";
  readonly code: number;
  readonly kind: CompactdErrorKind;
  readonly data: unknown;
  /** The method whose call failed, when known. */
  readonly method: string | undefined;

  constructor(code: number, message: string, data?: unknown, method?: string) {
    super(method ? `${method}: ${message} (code ${code})` : `${message} (code ${code})`);
    this.code = code;
    this.data = data;
    this.method = method;
    this.kind = kindOf(code, data);
  }

  /** True when the call was cancelled (by a token or this client's timeout). */
  get cancelled(): boolean {
    return this.code === RpcCodes.RequestCancelled;
  }
}

function kindOf(code: number, data: unknown): CompactdErrorKind {
  if (data !== null && typeof data === "object" && typeof (data as { kind?: unknown }).kind === "string") {
    return (data as { kind: string }).kind;
  }
  return KIND_BY_CODE.get(code) ?? STANDARD_KINDS[code] ?? "unknown_error";
}

/** Any rejection of a call as a `CompactdError` (a `ResponseError` keeps code and data). */
export function toCompactdError(error: unknown, method?: string, detail?: string): CompactdError {
  if (error instanceof CompactdError) return error;
  const suffix = detail ? `; ${detail}` : "";
  if (error instanceof ResponseError) {
    return new CompactdError(error.code, error.message + suffix, error.data, method);
  }
  const message = error instanceof Error ? error.message : String(error);
  return new CompactdError(RpcCodes.ConnectionInactive, message + suffix, undefined, method);
}
