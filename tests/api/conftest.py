"""API tests read pages, not progress: a request waits for any recording to finish (the
recording page that shows a slow one's progress has its own tests, which set the wait back)."""

from __future__ import annotations

import pytest

from app import traces


@pytest.fixture(autouse=True)
def recordings_finish_before_the_page(monkeypatch):
    monkeypatch.setattr(traces, "QUICK", 600.0)


@pytest.fixture(scope="module")
def model_data(tmp_path_factory, gemma_path):
    """A data directory holding the bundled model (a link to the one `make setup` installs)."""
    data = tmp_path_factory.mktemp("data")
    (data / "models").mkdir()
    (data / "models" / gemma_path.name).symlink_to(gemma_path)
    return data
