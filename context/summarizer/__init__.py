"""The summarizer: everything about asking a model for a summary, and nothing about when.

- `types`: the provider contract (`SummaryRequest`, `SummaryResult`, `SummaryFailure`) and
  `SummaryNeeded`, what a cascade yields when it needs one;
- `input`: the summarizer's input built from a range of rendered turns;
- `instructions` + `prompts/*.md`: what the model is told;
- `generate`: chunked generation folding a rolling summary, bounded in calls;
- `digest`: the offline, deterministic provider;
- `driver`: the one loop that answers a computation's summary requests.

The tiers (`compactd.context.tiers`) decide when a summary is due and what it replaces.
"""
