"""Errors meant for people: what was wrong, where, and what to do; and the exit codes.

Every command exits with one of four codes, the same for all of them:

| code | meaning |
|---|---|
| 0 | success |
| 1 | a finding the command exists to report (an alarm in `health`, a failed check) |
| 2 | bad input or usage: a `SearchRLError`, a wrong flag; the message says what to fix |
| 3 | an internal error (a bug): one line on the terminal, the traceback saved to a file |

and 130 when interrupted (Ctrl-C), as shells report a SIGINT.
"""

EXIT_OK = 0
EXIT_FINDING = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130


class SearchRLError(Exception):
    """An error the CLI prints without a traceback. The message must say what to fix."""


class DataError(SearchRLError):
    """Malformed input data; the message names the file and line."""


class RetrievalUnavailable(SearchRLError):
    """A retrieval backend did not answer after its retries."""


class DataWarning(UserWarning):
    """Input data that is accepted but looks wrong; the CLI prints it as one `warning:` line."""


def listing(values: list, limit: int = 10) -> str:
    """The first `limit` values, quoted, and how many more: for messages about many items.

    >>> listing(["a", "b", "c"], limit=2)
    "'a', 'b' and 1 more"
    """
    more = f" and {len(values) - limit} more" if len(values) > limit else ""
    return ", ".join(repr(v) for v in values[:limit]) + more
