"""`replay`: how a recorded session would have gone under the cascade, priced with the
provider's cache rules (`cache_model`), beside "no management" and the recorded run. The driver
(`driver`) runs an engine the way a live agent does; nothing here is part of the engine's core.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .driver import ReplayOptions, ReplayReport, fit_prompt_sizes, replay

__all__ = ["ReplayOptions", "ReplayReport", "fit_prompt_sizes", "replay"]


def __getattr__(name: str) -> Any:
    """The driver is loaded when it is used: the cache model's prices alone (what the stats
    read for a listing) must not load the engine with it."""
    if name in __all__:
        from . import driver

        return getattr(driver, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
