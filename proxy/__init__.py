"""The proxy: compactd in front of a provider's HTTP API, for agents nobody has to change.

A second front beside the daemon (`compactd.daemon`): it stands on the same services
(`compactd.service`), engine and stores, and never on the daemon's handlers. Adapters read and
write one provider's JSON; the engine decides what each request holds.
"""
