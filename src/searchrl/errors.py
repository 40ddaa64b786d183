"""Errors meant for people: what was wrong, where, and what to do."""


class SearchRLError(Exception):
    """An error the CLI prints without a traceback. The message must say what to fix."""


class DataError(SearchRLError):
    """Malformed input data; the message names the file and line."""


class RetrievalUnavailable(SearchRLError):
    """A retrieval backend did not answer after its retries."""
