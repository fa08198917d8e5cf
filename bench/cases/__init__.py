"""Benchmark cases: every module here registers its cases with `registry.case`."""
