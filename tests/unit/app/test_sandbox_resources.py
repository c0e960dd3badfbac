"""The sandbox against programs that hold the host's resources rather than escape: memory the
kernel keeps outside the worker's address space (SysV shared memory and message queues, memfd),
the kernel memory of a scratch full of empty files, and the per-user thread count that runs
would share if they shared a uid.

Each is a program that owns its process (ctypes, the C library's calls; the check and the Python
gate off), so only the kernel boundary (app/sandbox/boundary.py) stands in its way. Each case
asserts what the program met (the call refused, the inode cap), that the host's kernel memory
the attack would fill (Shmem, or the unreclaimable part of Slab, in /proc/meminfo) grew less than
a stated bound while it ran, that it ended in time and that no process of it outlived the run.
Those fields are the whole machine's, so `make test` runs this file first, alone (a browser test
beside it moved Shmem by 225 MiB).
"""

from __future__ import annotations

import os
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.sandbox import boundary as sandbox
from app.sandbox.boundary import RUN_UIDS, Boundary, BoundaryMissing, boundary, probe, seccomp_filter
from app.sandbox.run import Limits, run_program
from tests.unit.app.test_sandbox import sandbox_processes, survivors

LIMITS = Limits(cpu=10, wall=20, memory=3 << 30, output=10_000, steps=300, trace=8 << 20,
                file_size=1 << 20, disk=8 << 20)  # (files: the default, as it ships)
HELD = 64 << 20  # bytes the host's kernel memory may gain while a case runs (its field of
# /proc/meminfo, sampled: other processes on the machine move it too)
PROMPT = LIMITS.startup + LIMITS.wall + 15  # seconds a case may take, start to end


def raw(body: str) -> str:
    """A program that owns its process: the C library at hand (`libc`, errno kept)."""
    return ("import ctypes, os, sys, threading, time\n\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n\n\n"
            "def refused(what):\n"
            "    raise OSError(ctypes.get_errno(), what + ' refused')\n\n\n"
            "def run(n_threads=1):\n" + textwrap.indent(textwrap.dedent(body), "    ")
            + "\n    return {}\n")


@dataclass(frozen=True, slots=True)
class Holder:
    body: str  # a program holding memory the kernel keeps outside its address space, if the call
    # it starts with is let through
    refused: str  # the words of its error
    held_in: str  # the /proc/meminfo field the kernel would hold it in


HOLDERS = {
    "4 GiB of SysV shared memory": Holder("""
        libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
        libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        libc.shmat.restype = ctypes.c_void_p
        libc.shmdt.argtypes = [ctypes.c_void_p]
        for _ in range(4):  # segments of 1 GiB, each attached, filled and let go (kept by the kernel)
            shmid = libc.shmget(0, 1 << 30, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
            if shmid == -1:
                refused('shmget')
            addr = libc.shmat(shmid, None, 0)
            ctypes.memset(addr, 1, 1 << 30)
            libc.shmdt(addr)
        time.sleep(1)""", "[Errno 1] shmget refused", "Shmem"),
    "attaching a segment by its id": Holder("""
        libc.shmat.restype = ctypes.c_void_p
        for shmid in range(4):  # (an IPC namespace's first ids: refused, not EINVAL)
            if libc.shmat(shmid, None, 0) in (None, ctypes.c_void_p(-1).value):
                refused('shmat')""", "[Errno 1] shmat refused", "Shmem"),
    "200 memfd files of 1 MiB": Holder("""
        fds = []
        for _ in range(200):  # every descriptor a file of memory, of RLIMIT_FSIZE bytes
            fd = libc.memfd_create(b'x', 0)
            if fd == -1:
                refused('memfd_create')
            os.write(fd, b'x' * (1 << 20))
            fds.append(fd)
        time.sleep(1)""", "[Errno 1] memfd_create refused", "Shmem"),
    "8,000 full SysV message queues": Holder("""
        libc.msgsnd.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        message = ctypes.create_string_buffer(b'\\1' + bytes(7) + b'x' * 8192)  # mtype 1, 8 KiB
        for _ in range(8000):  # 16 KiB (msgmnb) each
            qid = libc.msgget(0, 0o1000 | 0o600)
            if qid == -1:
                refused('msgget')
            while libc.msgsnd(qid, message, 8192, 0o4000) == 0:  # IPC_NOWAIT
                pass
        time.sleep(1)""", "[Errno 1] msgget refused", "SUnreclaim"),
    "8 million SysV semaphores": Holder("""
        for _ in range(1000):
            if libc.semget(0, 8000, 0o1000 | 0o600) == -1:
                refused('semget')
        time.sleep(1)""", "[Errno 1] semget refused", "SUnreclaim"),
    "POSIX message queues": Holder("""
        for i in range(100):  # (RLIMIT_MSGQUEUE would stop it at 800 KB of messages)
            if libc.mq_open(f'/q{i}'.encode(), os.O_RDWR | os.O_CREAT, 0o600, None) == -1:
                refused('mq_open')""", "[Errno 1] mq_open refused", "SUnreclaim"),
}

FILE_FLOOD = """
    try:
        for i in range(400_000):
            os.close(os.open(f'f{i}', os.O_CREAT | os.O_WRONLY, 0o600))
    finally:
        print('files', len(os.listdir('.')))
        time.sleep(1)  # (the test measures the host's memory meanwhile)"""

THREAD_FLOOD = """
    threading.stack_size(64 << 10)  # (RLIMIT_NPROC, not RLIMIT_AS, is what should stop it)
    release = threading.Event()
    started = 0
    try:
        while started < 10_000:
            threading.Thread(target=release.wait, daemon=True).start()
            started += 1
    except RuntimeError:  # can't start new thread: this run's uid is at RLIMIT_NPROC
        pass
    print(os.getuid(), started)
    give_up = time.monotonic() + 15
    while not os.path.exists('done') and time.monotonic() < give_up:  # (the test's word: the
        time.sleep(0.05)  # other run has ended)
    release.set()"""

A_FEW_THREADS = """
    threads = [threading.Thread(target=time.sleep, args=(0.1,)) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(os.getuid(), len(threads))"""


def kernel_held(field: str) -> int:
    """Bytes of the host's memory in one field of /proc/meminfo: Shmem (tmpfs, SysV shared memory,
    memfd) or SUnreclaim (the kernel's objects that stay until freed: inodes, IPC objects; not
    the caches that any process's file lookups move)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, value = line.split(":", 1)
        if name == field:
            return int(value.split()[0]) << 10
    raise KeyError(field)


@dataclass
class Growth:
    """The most the host's kernel memory grew over its value at the start, sampled meanwhile."""

    start: int  # bytes before the run
    peak: int  # the most bytes seen since

    @property
    def bytes(self) -> int:
        return self.peak - self.start


class Watch:
    """Samples kernel_held(field) every 20 ms on a thread of its own while a run goes on."""

    def __init__(self, field: str) -> None:
        self.field = field

    def __enter__(self) -> Growth:
        start = kernel_held(self.field)
        self.growth = Growth(start, start)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self.growth

    def _sample(self) -> None:
        while not self.done.wait(0.02):
            self.growth.peak = max(self.growth.peak, kernel_held(self.field))

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()


def run_raw(body: str):
    """The program's trace, run with the gate off; that it ended in time and left no process."""
    before = sandbox_processes()
    started = time.monotonic()
    trace = run_program(raw(body), 1, LIMITS, gate=False)
    assert time.monotonic() - started < PROMPT
    assert survivors(before) == set(), "a process of the sandbox outlived its run"
    return trace


@pytest.mark.parametrize("name", list(HOLDERS))
def test_memory_outside_the_address_space_is_refused(name):
    holder = HOLDERS[name]
    with Watch(holder.held_in) as growth:
        trace = run_raw(holder.body)
    assert trace.error is not None and holder.refused in trace.error, trace.error
    assert growth.bytes < HELD, f"the host's {holder.held_in} grew by {growth.bytes >> 20} MiB"


def test_a_scratch_full_of_empty_files_stops_at_its_inode_cap():
    """400,000 empty files would cost the host ~400 MiB of kernel memory (their inodes ~325 MiB
    of it); the scratch's tmpfs holds Limits.files inodes (its root directory and program.py
    among them)."""
    with Watch("SUnreclaim") as growth:
        trace = run_raw(FILE_FLOOD)
    assert trace.error is not None and "No space left on device" in trace.error, trace.error
    files = int(trace.printed.split()[-1])
    assert LIMITS.files - 16 < files < LIMITS.files, trace.printed
    assert growth.bytes < HELD, f"the host's SUnreclaim grew by {growth.bytes >> 20} MiB"


def run_threads(pid: int) -> int:
    """How many threads a process has (0 once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))


def test_one_run_s_thread_flood_leaves_another_run_its_threads():
    """Two runs at once take two uids, so RLIMIT_NPROC counts each run's threads apart: a run
    that starts threads until the kernel refuses does not stop another run from starting its
    own. (The server is root here, as in CI; where it is not, bubblewrap's user namespace maps
    every run to the server's uid, and boundary.py says so.)"""
    assert os.geteuid() == 0, "runs take uids of their own only when the server is root"
    before = sandbox_processes()
    flood: dict = {}

    def flood_run() -> None:
        flood["trace"] = run_program(raw(THREAD_FLOOD), 1, LIMITS, gate=False)
        flood["ended"] = time.monotonic()

    flooding = threading.Thread(target=flood_run)
    flooding.start()
    deadline = time.monotonic() + LIMITS.startup
    while not (flooded := [pid for pid in sandbox_processes() - before if run_threads(pid) > 200]):
        assert time.monotonic() < deadline and flooding.is_alive(), flood.get("trace")
        time.sleep(0.05)
    other = run_program(raw(A_FEW_THREADS), 1, LIMITS, gate=False)
    other_ended = time.monotonic()
    Path(f"/proc/{flooded[0]}/root/scratch/done").touch()  # (into the flood's own scratch)
    flooding.join(PROMPT)
    assert not flooding.is_alive()
    assert other_ended < flood["ended"], "the other run ended after the flood: nothing was shown"

    flood_uid, flood_threads = map(int, flood["trace"].printed.split())
    assert flood["trace"].error is None and 200 < flood_threads < 256  # RLIMIT_NPROC (256) stopped it
    assert other.error is None, other.error
    other_uid, other_threads = map(int, other.printed.split())
    assert other_threads == 16
    assert flood_uid in RUN_UIDS and other_uid in RUN_UIDS and flood_uid != other_uid
    assert survivors(before) == set(), "a process of the sandbox outlived its run"


def test_the_probe_fails_where_the_filter_lets_these_calls_through(monkeypatch):
    """A filter without the refusals of the memory the kernel holds for a process, or of a new
    user namespace (an older list, a libseccomp that does not know the calls), leaves the
    playground off."""
    let_through = ("shm", "msg", "sem", "mq_", "memfd", "ipc", "unshare")
    kept = tuple(c for c in sandbox.REFUSED_CALLS if not c.startswith(let_through))
    monkeypatch.setattr(sandbox, "REFUSED_CALLS", kept)
    bpf, nr = seccomp_filter()
    with pytest.raises(BoundaryMissing) as e:
        probe(Boundary(boundary().bwrap, bpf, nr, boundary().run_uids))
    for door in ("SysV shared memory", "SysV message queues", "SysV semaphores", "POSIX message queues",
                 "memfd", "a user namespace"):
        assert door in str(e.value)
