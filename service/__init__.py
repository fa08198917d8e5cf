"""The services around the engine that every front shares.

A front serves clients in its own protocol: the daemon (`compactd.daemon`, JSON-RPC over stdio)
and the proxy (`compactd.proxy`, the providers' HTTP APIs). Both stand on these: the registry of
loaded sessions (`registry`), the one cascade driver that answers the engine's summary requests
with a provider (`compaction`, `providers`), the work done between requests (`background`) and
the engine's results in wire shapes (`events`). `app.App` binds them to one engine over one store
and speaks to clients only through the `Front` it is given.
"""
