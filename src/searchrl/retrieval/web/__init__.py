"""Online web search as a `Retriever` (`retrieval.web`, `--web PROVIDER`): providers.py (the
search APIs), pages.py (fetch, extract, condense), budget.py (caps, pace, keys), retriever.py."""
