"""The tiers of the cascade, one module each (spec §4), over the `Run` of `base.py`:

- `microcompact` — Tier 1: clear old tool results (time-based placeholders, or the
  provider's server-side edit on Anthropic);
- `snip` — Tier 2: drop whole old turns;
- `collapse` — Tier 3: segment summaries, reversible;
- `rolling_summary` — Tier 4: the rolling summary (auto-compact and `/compact`);
- `reactive` — Tier 5: the provider said the prompt was too long.

Each tier has `due(run)`, the condition, beside `apply(run)`, the action. Which tier runs
when is `compactd.context.cascade`'s business alone.
"""
