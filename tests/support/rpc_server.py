"""Real ggml's RPC backend on loopback: a second backend whose buffers are not host memory.

`rpc_server()` starts `ggml_backend_rpc_start_server` (serving the oracle's CPU device) in a child
process on a free 127.0.0.1 port, waits until it accepts connections (at most 20 s), and stops it
on exit. Run directly (`python -m tests.support.rpc_server PORT`) it is that child.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import socket
import subprocess
import sys
import time


def _die_with_parent() -> None:
    """In the child, before it runs: be killed when the test process dies (even if it crashes)."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def rpc_server(timeout: float = 20.0):
    """Yields the endpoint (bytes, "127.0.0.1:PORT") of a running RPC server."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.rpc_server", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=_die_with_parent)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the RPC server exited: {proc.stderr.read().decode(errors='replace')[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the RPC server did not listen on port {port} within {timeout} s")
                time.sleep(0.05)
        yield f"127.0.0.1:{port}".encode()
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _serve(port: int) -> None:
    import ggml as real

    assert real.GGML_USE_RPC, "the oracle was built without GGML_RPC (see the Makefile's ORACLE_CMAKE_ARGS)"
    cpu = real.ggml_backend_dev_by_type(real.GGML_BACKEND_DEVICE_TYPE_CPU)
    devices = (real.ggml_backend_dev_t_ctypes * 1)(cpu)
    real.ggml_backend_rpc_start_server(f"127.0.0.1:{port}".encode(), None, 1, 1, devices)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
