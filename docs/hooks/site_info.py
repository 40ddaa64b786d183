"""MkDocs hook: the site's footer names the searchrl version it documents (and the commit, in a
checkout), and the header links the repository when pyproject.toml names it
(`[project.urls] Repository`).

Registered in mkdocs.yml with `hooks: [docs/hooks/site_info.py]`.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def site_info(root: Path = ROOT) -> dict[str, str | None]:
    """{"version", "commit", "repository"} of the checkout at `root` (None where unknown)."""
    # Read as text, not with tomllib: the docs build on Python 3.10 too.
    pyproject = (root / "pyproject.toml").read_text(encoding="utf-8")
    version = re.search(r'^version\s*=\s*"([^"]+)"', pyproject, re.M)
    repository = re.search(r'^Repository\s*=\s*"([^"]+)"', pyproject, re.M)
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"version": version.group(1) if version else None, "commit": commit,
            "repository": repository.group(1) if repository else None}


def on_config(config):
    info = site_info()
    config["copyright"] = f"searchrl {info['version']}" + (f" (commit {info['commit']})" if info["commit"] else "")
    if info["repository"]:
        config["repo_url"] = info["repository"]
        config["repo_name"] = "searchrl"
    return config
