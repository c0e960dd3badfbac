"""Browser-test fixtures shared by every browser test: the app served by uvicorn on a free
localhost port (`server_url`), and a fresh chromium page (`page`) from Debian's chromium.

Nothing downloads a browser: if /usr/bin/chromium is missing the tests fail, they never skip.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import uvicorn
from playwright.sync_api import Browser, Page, expect, sync_playwright

from app.main import create_app
from app.settings import Settings

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
# where the screenshots go: a temporary folder, unless `make screenshots` names docs/screenshots
SCREENSHOTS_ENV = "GGML_LENS_SCREENSHOTS"


@contextmanager
def serving(settings: Settings) -> Iterator[str]:
    """The app with `settings`, served by uvicorn in a background thread on a free port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(settings), log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture(scope="session")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The app, with its own data directory."""
    with serving(Settings(data_dir=tmp_path_factory.mktemp("lens-data"), programs=True)) as url:
        yield url


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium package (make setup-test)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh page in its own context (no shared cookies or storage), 1280 x 900."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    expect.set_options(timeout=15_000)  # (an assertion waits as long as an action: both cores may be busy)
    yield page
    context.close()


@pytest.fixture(scope="session")
def screenshot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A temporary folder, so a test run leaves the README's screenshots alone;
    `make screenshots` sets GGML_LENS_SCREENSHOTS=docs/screenshots to refresh them on purpose."""
    chosen = os.environ.get(SCREENSHOTS_ENV)
    path = Path(chosen) if chosen else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path
