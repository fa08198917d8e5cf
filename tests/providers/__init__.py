"""Tests of the summary providers.

The shared helpers live in the `tests.support` package, importable only with the repository root
on `sys.path`. Plain `pytest` does not put it there while `tests/` has no `__init__.py` (nor the
pytest config a `pythonpath`), so this package adds it — a no-op once either exists.
"""

import sys
from pathlib import Path

_REPO_ROOT = str(Path(__file__).resolve().parents[2])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)
