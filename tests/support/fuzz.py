"""The fuzz suites' budget: `COMPACTD_FUZZ_EXAMPLES` examples per test (each suite its own
default), derandomized so CI is reproducible unless `COMPACTD_FUZZ_RANDOM` is set (to hunt)."""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings


def budget(default: int, **extra: Any) -> settings:
    return settings(
        max_examples=int(os.environ.get("COMPACTD_FUZZ_EXAMPLES", str(default))),
        deadline=None,
        derandomize=not os.environ.get("COMPACTD_FUZZ_RANDOM"),
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        **extra,
    )
