"""Shared fixtures. Integration tests need ../shared/data; they skip, loudly, only when it is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

from searchrl.paths import find_shared_data


@pytest.fixture(scope="session")
def shared_data() -> Path:
    found = find_shared_data()
    if found is None:
        pytest.skip("shared/data is absent beside the checkout (set SEARCHRL_DATA to run this test)")
    return found
