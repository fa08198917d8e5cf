"""Method and notification names of the compactd RPC surface (DESIGN §6)."""

from __future__ import annotations

SESSION_OPEN = "session/open"
SESSION_LIST = "session/list"
SESSION_GET = "session/get"
SESSION_APPEND = "session/append"
SESSION_TOOL_RESULT = "session/toolResult"
SESSION_BRANCH = "session/branch"
SESSION_CHECKOUT = "session/checkout"
SESSION_IMPORT = "session/import"
SESSION_REPLAY = "session/replay"
FUNCTION_START = "function/start"
FUNCTION_COMPLETE = "function/complete"
CONTEXT_RENDER = "context/render"
CONTEXT_MEASURE = "context/measure"
CONTEXT_COMPACT = "context/compact"
CONTEXT_SNIP = "context/snip"
CONTEXT_UNCOLLAPSE = "context/uncollapse"
CONTEXT_RECALL = "context/recall"
CONTEXT_REPORT_USAGE = "context/reportUsage"
DAEMON_STATUS = "daemon/status"

# daemon -> client
NOTIFY_COMPACTED = "context/compacted"
NOTIFY_SESSION_CHANGED = "session/changed"
NOTIFY_SESSION_IDLE = "session/idle"
REQUEST_SUMMARIZE = "context/summarize"
