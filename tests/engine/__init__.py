"""Tests of the engine core (compactd.context)."""
