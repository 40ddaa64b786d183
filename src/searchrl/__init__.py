"""searchrl: teach language models to search while they reason (R1-Searcher, outcome-based RL)."""

__version__ = "0.1.0"
