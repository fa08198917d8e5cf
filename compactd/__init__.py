"""compactd — a local sidecar daemon that owns LLM agent conversations and their context windows.

The repository's top-level folders are this package's subpackages: `compactd.context` (the pure
engine), `compactd.protocol` (wire types), `compactd.daemon` (the JSON-RPC server) and
`compactd.clients` (the Python client and CLI).
"""

__version__ = "0.1.0"
