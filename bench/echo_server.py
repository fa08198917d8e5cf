"""The floor of the RPC benchmarks: a minimal hand-written asyncio JSON-RPC loop on stdio
(LSP framing, orjson), answering every request with `{"ok": true}` — the least a daemon can do.
`echo/set {reply}` keeps a reply that every `echo/get` then answers, encoded again each time
(the floor of an RPC with a large answer: encode, pipe, decode). `shutdown` and `exit` behave
as in compactd so the same client can drive both."""

from __future__ import annotations

import asyncio
import sys

import orjson


async def main() -> int:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    out = sys.stdout.buffer
    kept: object = {"ok": True}
    while True:
        length = 0
        while True:
            line = await reader.readline()
            if not line:
                return 0
            if line == b"\r\n":
                break
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        message = orjson.loads(await reader.readexactly(length))
        if message.get("method") == "exit":
            return 0
        method = message.get("method")
        if method == "echo/set":
            kept = message["params"]["reply"]
        if "id" in message:
            result = kept if method == "echo/get" else {"ok": True}
            body = orjson.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result})
            out.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
            out.flush()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
