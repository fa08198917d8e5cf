"""compactd's JSON-RPC error codes (outside the JSON-RPC −32768..−32000 and LSP −32899..−32800
reserved ranges). Every error also carries `data.kind`, a stable name for the same thing.

Plain ints, no imports: a client depends on this module without pulling in the engine or pygls.
"""

from __future__ import annotations

# JSON-RPC / LSP codes the daemon answers with
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
REQUEST_CANCELLED = -32800

# compactd's own codes: kind -> (code, meaning)
ERRORS: dict[str, tuple[int, str]] = {
    "invalid_session_id": (4000, "The session id is not valid (it could name a path)."),
    "unknown_session": (4004, "No session with that id exists in the data dir."),
    "unknown_node": (4005, "The session has no node with that id."),
    "unknown_branch": (4006, "The session has no branch with that name."),
    "unknown_handle": (4007, "No recall handle of that name on this session's branch."),
    "invalid_graph": (4010, "The input would make the graph invalid."),
    "invalid_pairing": (4011, "A tool result does not match exactly one open tool call."),
    "invalid_content": (4012, "A message or content block is malformed."),
    "invalid_config": (4013, "A configuration value is not valid."),
    "too_large": (
        4014,
        "An input is over a size limit (data.limit names it: maxRequestBytes, maxMessageBytes "
        "or maxImportBytes); nothing was written.",
    ),
    "invalid_path": (
        4015,
        "A path the daemon will not read: not a regular file, a NUL byte in it, or a file "
        "outside the transcript's own folder.",
    ),
    "invalid_search": (
        4016,
        "A recall search compactd will not run: empty, too long, a regular expression RE2 does "
        "not take (backreferences, lookaround, a repetition over 1,000), or context out of "
        "range; nothing was written.",
    ),
    "pending_tool_results": (4020, "The head still waits for tool results."),
    "head_conflict": (4030, "expectedHead did not match: another writer moved the thread."),
    "cannot_fit": (4040, "Nothing the cascade may do brings the request under its limit."),
    "provider_failure": (4050, "The summary provider failed; nothing was written."),
    "store_failure": (4060, "The session log could not be read or written."),
    "shutting_down": (4070, "The daemon is shutting down."),
}

CODE_BY_KIND: dict[str, int] = {kind: code for kind, (code, _) in ERRORS.items()}
KIND_BY_CODE: dict[int, str] = {code: kind for kind, code in CODE_BY_KIND.items()}


def code_for(kind: str) -> int:
    return CODE_BY_KIND.get(kind, INTERNAL_ERROR)
