"""MkDocs hook: the reference pages `reference/cli.md`, `reference/config.md` and
`reference/metrics.md`, generated from the code (`searchrl.docs_reference`) into every build and
every `mkdocs serve` reload, so they never drift. The copies committed under docs/reference/
are for readers of the repository (a test keeps them equal to the generated pages).

Registered in mkdocs.yml with `hooks: [docs/hooks/reference.py]`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.structure.files import File

SRC = Path(__file__).resolve().parents[2] / "src"  # this checkout's code, before an installed copy


def _pages() -> dict[str, str]:
    if str(SRC) not in sys.path:
        sys.path.insert(0, str(SRC))
    from searchrl.docs_reference import pages

    return pages()


def on_files(files, config):
    for name, content in _pages().items():
        uri = f"reference/{name}"
        stale = files.get_file_from_path(uri)
        if stale is not None:  # a copy written by `python -m searchrl.docs_reference docs/reference`
            files.remove(stale)
        files.append(File.generated(config, uri, content=content))
    return files


def on_serve(server, config, builder):
    server.watch(str(SRC / "searchrl"))  # a changed help text rebuilds the pages
    return server
