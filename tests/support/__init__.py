"""Test helpers shared by the test suites (fake provider servers and the like)."""
