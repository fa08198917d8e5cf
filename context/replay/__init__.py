"""`replay`: how a recorded session would have gone under the cascade, priced with the
provider's cache rules (`cache_model`), beside "no management" and the recorded run. The driver
(`driver`) runs an engine the way a live agent does; nothing here is part of the engine's core.
"""

from .driver import ReplayOptions, ReplayReport, fit_prompt_sizes, replay

__all__ = ["ReplayOptions", "ReplayReport", "fit_prompt_sizes", "replay"]
