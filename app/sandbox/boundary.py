"""The kernel boundary around a learner's program: namespaces, a seccomp filter, another uid,
rlimits. What holds here holds even when the program owns its process completely (it may run any
native code in it): the worker's Python gate (worker.py) and the server's check (check.py) only
teach, they are not the boundary.

A run is `bwrap` (Debian's bubblewrap) starting `python -m app.sandbox.worker`:

- new PID, network, IPC, UTS and cgroup namespaces (and a user namespace when the server is not
  root): the worker sees no other process, and its network has only its own loopback;
- a mount namespace holding nothing but read-only binds of /usr, the Python installation, the
  virtual environment and the project's two packages, and a /dev of DEVICES; `/` itself is
  read-only. The worker mounts its only writable place itself, a tmpfs at /scratch of
  `Limits.disk` bytes and `Limits.files` inodes (bubblewrap's own tmpfs caps bytes only, and every
  empty file costs the host ~1 KB of kernel memory); bwrap keeps it CAP_SYS_ADMIN for that alone;
- when the server is root, the worker takes a uid and gid of its own before it reads the program
  (`run_uid`: one of RUN_UIDS, held under a lock file no other run on this machine can take
  meanwhile), so RLIMIT_NPROC and the kernel's other per-user counts are each run's own; then it
  drops every capability and loads the seccomp filter below on every thread: no process but
  threads, no exec, no socket, no ptrace, no signal to another process, no mount, namespace,
  keyring, bpf, perf or io_uring call, and none of the kernel's memory that RLIMIT_AS does not
  count (SysV shared memory, message queues and semaphores, POSIX message queues, memfd);
- rlimits from the server: address space, CPU time (the hard limit is the kernel's SIGKILL), file
  size, open files, processes (threads), no core files;
- `--die-with-parent` and `--new-session`; the server kills bwrap's process group at the wall-clock
  limit, and the PID namespace guarantees that nothing the worker started outlives it.

What this leaves out: no cgroup (none is assumed delegated to the server). A run's memory is
its address space, its scratch's bytes and inodes, and the kernel's per-task and per-descriptor
costs of at most RLIMIT_NPROC threads and RLIMIT_NOFILE descriptors. When the server is not root,
bubblewrap's user namespace maps every worker to the server's own uid: the kernel counts
RLIMIT_NPROC for that uid across every run (and the server), so while one run's threads fill it,
another run cannot start (bwrap's clone fails); per-run counts need the server to run as root.

`boundary()` builds the filter once and runs a probe worker that must see all of this refused; if
anything is missing (no bubblewrap, no user namespaces, no seccomp, a filter that lets a SysV or
memfd call through, a scratch without its inode cap) it raises BoundaryMissing, and the
playground stays off unless the server was started with --allow-unconfined-programs.
"""

from __future__ import annotations

import base64
import errno
import fcntl
import inspect
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import app
import engine
from engine.lanes import pure_numpy

SCRATCH = "/scratch"  # the worker's working directory: a tmpfs it mounts, bytes and inodes capped
DATA = "/data"  # the worker's data directory: the bundled model, read-only, if the server has it
STARTUP_WALL = 10  # seconds a worker may take to start (besides the program's wall-clock limit)
STDERR_KEPT = 8 << 10
# the worker's /dev: these devices alone, bound from the host (not bwrap's --dev: without root it
# puts the worker in a second, nested user namespace, where it could not mount its scratch)
DEVICES = ("null", "zero", "full", "random", "urandom")
WORKER_BOOT = ("import runpy, sys; sys.path.insert(0, sys.argv[1]); "
               "runpy.run_module('app.sandbox.worker', run_name='__main__', alter_sys=True)")
# the uids (and gids) runs take when the server is root, one per run at a time: no account has
# them, so a run's processes and files are its own; a lock file per uid says which are taken
RUN_UIDS = range(2_000_000_000, 2_000_000_000 + 256)
UID_LOCKS = Path("/run/ggml-lens/uids")
CLONE_THREAD = 0x00010000

# calls the filter refuses with EPERM (ENOSYS for clone3, so the C library falls back to clone,
# whose flags the filter can read); clone itself is allowed only with CLONE_THREAD
REFUSED_CALLS = (
    # processes and programs
    "fork", "vfork", "execve", "execveat",
    # other processes: tracing, their memory, signals, pidfds
    "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "kcmp", "kill", "tkill",
    "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_open", "pidfd_getfd", "pidfd_send_signal",
    # the network
    "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4",
    # mounts and namespaces
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "move_mount", "open_tree",
    "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    # keyrings
    "add_key", "request_key", "keyctl",
    # the kernel's other doors
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot",
    "swapon", "swapoff", "acct", "quotactl", "syslog", "open_by_handle_at", "name_to_handle_at",
    "iopl", "ioperm", "personality", "modify_ldt", "uselib", "vhangup", "mknod", "mknodat",
    "lookup_dcookie", "nfsservctl", "setdomainname", "sethostname", "settimeofday", "clock_settime",
    "adjtimex", "clock_adjtime",
    # memory the kernel holds outside the worker's address space, which RLIMIT_AS does not count
    # (an IPC namespace frees it only when the run ends): SysV shared memory, message queues and
    # semaphores (`ipc` multiplexes them where the architecture has it), POSIX message queues,
    # memory file descriptors
    "shmget", "shmat", "shmdt", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop",
    "semtimedop", "semctl", "ipc", "mq_open", "memfd_create", "memfd_secret",
)


class BoundaryMissing(Exception):
    """The kernel boundary cannot be set up on this machine (says what is missing)."""


@dataclass(frozen=True, slots=True)
class Limits:
    cpu: int = 30  # seconds of CPU time the program may use (all threads)
    wall: int = 45  # seconds it may run
    memory: int = 3 << 30  # bytes of address space of the whole worker (numpy and the engine take ~1 GB)
    output: int = 64 << 10  # characters it may print
    steps: int = 5_000  # steps its trace may have
    trace: int = 320 << 20  # bytes of the trace the worker sends (its patches' bytes and the rest:
    # a copy of the gemma3 walkthrough loads 246 MB of weights)
    pools: int = 1 << 30  # bytes of the memory pools and buffers the trace may rebuild
    file_size: int = 16 << 20  # bytes of any one file it writes in its scratch directory
    disk: int = 64 << 20  # bytes of its scratch directory (a tmpfs)
    files: int = 4096  # files and directories its scratch directory may hold (the tmpfs's
    # nr_inodes: each costs the host ~1 KB of kernel memory that `disk` does not count)
    startup: int = 20  # seconds of CPU the worker may spend starting (imports) before the program


@dataclass(frozen=True, slots=True)
class Boundary:
    """How to start a confined worker on this machine (None fields: what the run leaves out)."""

    bwrap: str | None  # None: unconfined (--allow-unconfined-programs on localhost)
    bpf: bytes  # the seccomp filter, as the kernel loads it (empty: none)
    seccomp_nr: int  # the seccomp() call's number on this machine (for its TSYNC flag)
    run_uids: range | None  # the uids (and gids) a run takes one of before the program (the
    # server is root); None: the user namespace's, the server's own uid

    @property
    def confined(self) -> bool:
        return self.bwrap is not None

    def command(self, limits: Limits, model: Path | None = None, label: str = "program") -> list[str]:
        """The argv of one run (the worker reads its request on stdin). `model`: the bundled
        model's file, bound read-only where the worker's data directory (/data) has it."""
        # the worker imports the very packages this server runs (first on its path), whatever
        # the environment's import hooks would map `app` to
        root = str(Path(os.path.abspath(app.__file__)).parent.parent)
        worker = [sys.executable, "-I", "-c", WORKER_BOOT, root, label]  # (label: what `ps` shows it doing)
        if self.bwrap is None:
            return worker
        env = worker_env()
        namespaces = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                      "--unshare-cgroup-try"]
        # the worker keeps only what it needs to mount its scratch (and, root, to take its uid);
        # it drops them before it reads the program
        if self.run_uids is None:  # not root: an unprivileged user namespace is what allows the rest
            # (not --disable-userns: its nested namespace could not mount; the filter refuses
            # unshare and clone's namespace flags, and the probe tries one)
            namespaces = ["--unshare-user", *namespaces, "--cap-add", "CAP_SYS_ADMIN"]
        else:
            namespaces += ["--cap-drop", "ALL", "--cap-add", "CAP_SYS_ADMIN",
                           "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        argv = [self.bwrap, *namespaces, "--die-with-parent", "--new-session",
                "--ro-bind", "/usr", "/usr"]
        for name in ("lib", "lib64", "bin", "sbin"):
            p = Path("/") / name
            if p.is_symlink():
                argv += ["--symlink", os.readlink(p), str(p)]
            elif p.is_dir():
                argv += ["--ro-bind", str(p), str(p)]
        if Path("/etc/ld.so.cache").exists():
            argv += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
        made: set[Path] = {Path("/")}
        for path in read_only_paths():
            for parent in reversed(path.parents):  # bwrap would make them 0700: nobody could pass
                if parent not in made:
                    argv += ["--perms", "0755", "--dir", str(parent)]
                    made.add(parent)
            argv += ["--ro-bind", str(path), str(path)]
        if model is not None and model.is_file():
            argv += ["--perms", "0755", "--dir", DATA, "--perms", "0755", "--dir", f"{DATA}/models",
                     "--ro-bind", str(model), f"{DATA}/models/{model.name}"]
            env["GGML_LENS_DATA"] = DATA
        argv += ["--perms", "0755", "--dir", "/dev"]
        for name in DEVICES:
            argv += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
        argv += ["--perms", "0755", "--dir", SCRATCH,  # (where the worker mounts its scratch)
                 "--remount-ro", "/", "--chdir", SCRATCH, "--hostname", "sandbox",
                 "--clearenv", *(x for k, v in env.items() for x in ("--setenv", k, v)),
                 "--", *worker]
        return argv

    def preexec(self, limits: Limits):
        """What the child does before it execs bwrap: its rlimits (inherited by the worker)."""
        cpu = limits.startup + limits.cpu

        def set_limits() -> None:
            for what, soft, hard in ((resource.RLIMIT_AS, limits.memory, limits.memory),
                                     (resource.RLIMIT_CPU, cpu, cpu + 5),  # hard: the kernel's SIGKILL
                                     (resource.RLIMIT_FSIZE, limits.file_size, limits.file_size),
                                     (resource.RLIMIT_NOFILE, 256, 256),
                                     (resource.RLIMIT_NPROC, 256, 256),
                                     (resource.RLIMIT_CORE, 0, 0)):
                resource.setrlimit(what, (soft, hard))
        return set_limits


def worker_env() -> dict[str, str]:
    """The worker's whole environment (the engine's mode included: C loops or numpy twins)."""
    return {"PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
            "LANG": "C.UTF-8", "HOME": SCRATCH, "TMPDIR": SCRATCH, "PYTHONDONTWRITEBYTECODE": "1",
            "GGML_LENS_PURE_NUMPY": "1" if pure_numpy() else "0"}


def read_only_paths() -> list[Path]:
    """What the worker must read besides /usr: the Python installation, the virtual environment
    and the two packages (an editable install keeps them outside the environment). Nothing else:
    not the data directory, not other learners' programs, not the uploads."""
    # (as the worker will name them: a virtual environment that is a symlink is bound where
    # the symlink is, since Python finds its pyvenv.cfg beside the path it was started by)
    paths = {Path(os.path.abspath(p)) for p in (sys.base_prefix, sys.prefix, sys.exec_prefix)}
    paths |= {Path(os.path.abspath(inspect.getfile(m))).parent for m in (engine, app)}
    paths = {p for p in paths if not (p == Path("/usr") or Path("/usr") in p.parents)}
    # a path inside another is bound with it
    return sorted(p for p in paths if not any(q in p.parents for q in paths))


def seccomp_filter() -> tuple[bytes, int]:
    """The filter (BPF, as libseccomp compiles it for this machine) and seccomp()'s number."""
    try:
        import pyseccomp as sc
    except (ImportError, RuntimeError) as e:  # RuntimeError: libseccomp itself is missing
        raise BoundaryMissing(f"libseccomp is not usable here ({e}): install Debian's libseccomp2") from None
    f = sc.SyscallFilter(sc.ALLOW)
    arch = sc.system_arch()
    for name in dict.fromkeys(REFUSED_CALLS):
        try:
            sc.resolve_syscall(arch, name)
        except Exception:  # noqa: BLE001 - a call this architecture does not have
            continue
        f.add_rule(sc.ERRNO(errno.EPERM), name)
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    f.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_THREAD, 0))
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        bpf = out.read()
    return bpf, sc.resolve_syscall(arch, "seccomp")


_PROBED: dict[bool, Boundary | BoundaryMissing] = {}
_PROBING = threading.Lock()


def boundary(unconfined: bool = False) -> Boundary:
    """The boundary this machine gives, probed once per process (BoundaryMissing if it cannot be
    set up; `unconfined`: the caller chose to run without one, on localhost only)."""
    with _PROBING:  # (requests arriving together wait for the one probe)
        if unconfined not in _PROBED:
            try:
                _PROBED[unconfined] = _set_up(unconfined)
            except BoundaryMissing as e:
                _PROBED[unconfined] = e
        found = _PROBED[unconfined]
    if isinstance(found, BoundaryMissing):
        raise found
    return found


def _set_up(unconfined: bool) -> Boundary:
    if unconfined:
        return Boundary(None, b"", 0, None)
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise BoundaryMissing("bubblewrap (bwrap) is not installed: `make setup` installs Debian's package")
    bpf, nr = seccomp_filter()
    b = Boundary(bwrap, bpf, nr, RUN_UIDS if os.geteuid() == 0 else None)
    probe(b)
    return b


def probe(b: Boundary) -> None:
    """Start a worker in probe mode: it must find itself confined (another uid, no capability,
    the filter on: no network, no process, no SysV IPC or memfd; no file outside scratch, whose
    inodes are capped). BoundaryMissing says what was not."""
    try:
        out, err, code, _ = start_worker(b, Limits(cpu=10, wall=20), {"probe": True})
    except OSError as e:
        raise BoundaryMissing(f"bubblewrap could not start: {e}") from None
    text = out.decode("utf-8", "replace").strip()
    if code != 0 or text != "confined":
        why = err.decode("utf-8", "replace").strip() or text or f"exit status {code}"
        raise BoundaryMissing(f"the sandbox could not be set up on this machine: {why[:500]}")


def start_worker(b: Boundary, limits: Limits, request: dict,
                 model: Path | None = None) -> tuple[bytes, bytes, int, bool]:
    """Run one worker to its end: (stdout, at most limits.trace + 1 bytes of it; the head of
    stderr; the exit status; whether the wall-clock limit stopped it)."""
    request = {**request, "seccomp": base64.b64encode(b.bpf).decode(), "seccomp_nr": b.seccomp_nr}
    if not b.confined:
        scratch = tempfile.mkdtemp(prefix="ggml-lens-program-")
        try:
            return _communicate(b, limits, request, scratch, model)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    request["scratch"] = {"path": SCRATCH, "bytes": limits.disk, "inodes": limits.files}
    if b.run_uids is None:
        return _communicate(b, limits, request, None, model)
    with run_uid(b.run_uids) as uid:
        return _communicate(b, limits, {**request, "uid": uid}, None, model)


@contextmanager
def run_uid(uids: range) -> Iterator[int]:
    """One of `uids` that no other run on this machine holds (in this server or another), held
    for one run: a lock file per uid, locked with flock (the kernel lets it go if the server dies)."""
    UID_LOCKS.mkdir(mode=0o700, parents=True, exist_ok=True)
    first = int.from_bytes(os.urandom(2), "little") % len(uids)  # (a just-freed uid waits its turn)
    deadline = time.monotonic() + STARTUP_WALL
    while True:
        for uid in (uids[(first + i) % len(uids)] for i in range(len(uids))):
            fd = os.open(UID_LOCKS / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield uid
            finally:
                os.close(fd)  # (closing the descriptor unlocks)
            return
        if time.monotonic() > deadline:
            raise BoundaryMissing(f"all {len(uids)} uids for runs are taken: too many programs "
                                  f"are running on this machine")
        time.sleep(0.1)


def _communicate(b: Boundary, limits: Limits, request: dict, scratch: str | None, model: Path | None):
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    if not b.confined:
        env = worker_env() | ({"GGML_LENS_DATA": str(model.parent.parent)} if model is not None else {})
    argv = b.command(limits, model, "probe" if request.get("probe") else "program")
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=b.preexec(limits), start_new_session=True, close_fds=True, env=env,
                            cwd=scratch or "/")
    out: list[bytes] = []
    err: list[bytes] = []

    def read(stream, into: list[bytes], cap: int) -> None:
        n = 0
        while chunk := stream.read(1 << 16):
            if n <= cap:
                into.append(chunk[:cap + 1 - n])
                n += len(chunk)
            elif into is out:  # more than any trace may be: whatever it is, it is not read
                _kill(proc)
                return

    readers = [threading.Thread(target=read, args=(proc.stdout, out, limits.trace), daemon=True),
               threading.Thread(target=read, args=(proc.stderr, err, STDERR_KEPT), daemon=True)]
    for r in readers:
        r.start()
    stdin = proc.stdin
    assert stdin is not None  # (a pipe)
    try:
        stdin.write(json.dumps(request).encode())
        stdin.close()
    except BrokenPipeError:
        pass
    timed_out = False
    try:
        proc.wait(STARTUP_WALL + limits.wall)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill(proc)
        proc.wait()
    for r in readers:
        r.join(5)
    return b"".join(out), b"".join(err), proc.returncode, timed_out


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
