"""`python -m app.sandbox.worker`: record one learner's program, in a process of its own.

The server starts this module behind the kernel boundary (boundary.py: bubblewrap's namespaces,
rlimits already set, an empty /scratch as its working directory). It reads the request on stdin
(JSON: the program, the thread count, the limits, the seccomp filter, the scratch's caps, the uid
to take) and first confines itself: it mounts its scratch tmpfs (bytes and inodes capped), takes
the run's uid, drops every capability and loads the filter on every thread, before any of the
program is read. It writes the result on stdout in the format of wire.py: the trace as plain
data, or a message saying why there is none. A probe request (`{"probe": true}`) only reports
whether every door the boundary closes is closed.

Then, with the gate on (always, but in the sandbox's own tests), the Python gate closes: a
teaching aid that refuses early and clearly what the kernel would refuse anyway:

- everything the engine will need is imported, then any further import is refused;
- an audit hook refuses opening files outside the scratch directory and Python's own
  installation, subprocesses, fork and exec, sockets, and loading or calling C code through ctypes;
- the program's builtins lack eval, exec, getattr and the rest check.py refuses, and its imports
  give restricted copies of the allowed modules.

In both cases a CPU-time and a wall-clock alarm, the printed-output limit and the step cap raise
ProgramStopped inside the program, so the trace keeps every step before it; a program that ignores
them meets the kernel's SIGKILL and the server's.
"""

from __future__ import annotations

import ast
import base64
import builtins
import ctypes
import importlib
import io
import json
import os
import pkgutil
import resource
import signal
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import engine
from app.sandbox.check import REFUSED_ATTRIBUTES, REFUSED_NAMES, check_program, importable, is_module
from app.sandbox.wire import encode_failure, encode_trace
from engine.core.errors import ProgramStopped
from engine.models import bundled
from engine.core.tensor import Tensor

PROGRAM_FILE = "program.py"
NUMPY_SUBMODULES = ("random", "linalg", "fft")
REFUSED_EVENTS = ("os.system", "os.exec", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn",
                  "os.kill", "os.killpg", "os.putenv", "os.unsetenv", "subprocess.", "pty.", "socket.",
                  "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function",
                  "ctypes.set_errno", "ctypes.get_errno", "sys.remote_exec", "webbrowser.", "urllib.",
                  "http.", "ftplib.", "smtplib.", "import", "winreg.", "_posixsubprocess.",
                  "os.chdir", "os.chroot", "os.setuid", "os.setgid", "resource.setrlimit", "signal.")
PATH_EVENTS = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link",
               "os.symlink", "os.truncate", "os.utime", "os.listdir", "os.scandir", "shutil.", "glob.",
               "os.listxattr", "os.getxattr", "os.setxattr", "os.removexattr", "os.walk", "os.fwalk")
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC = 1, 1
MS_NOSUID, MS_NODEV = 2, 4  # mount flags (<sys/mount.h>)
LINUX_CAPABILITY_VERSION_3 = 0x20080522
IPC_PRIVATE, IPC_CREAT = 0, 0o1000  # (<sys/ipc.h>)
CLONE_NEWUSER = 0x10000000
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


class SockFprog(ctypes.Structure):
    """struct sock_fprog: a BPF program as seccomp() takes it."""
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class CapHeader(ctypes.Structure):
    """struct __user_cap_header_struct (capget and capset)."""
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    """struct __user_cap_data_struct: one of two, 32 capabilities each."""
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


class BoundedText(io.TextIOBase):
    """The program's stdout and stderr: kept up to `limit` characters, then ProgramStopped."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[str] = []
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.size += len(s)
        if self.size > self.limit:
            raise ProgramStopped(f"the program printed more than {self.limit:,} characters")
        self.parts.append(s)
        return len(s)

    def text(self) -> str:
        return "".join(self.parts)


# numpy's own modules that its C code imports when first needed (printing an array or a dtype,
# an error message): the import runs through the program's builtins, so the gate hands them out
NUMPY_OWN = ("numpy._core._dtype", "numpy._core._internal", "numpy._core._exceptions",
             "numpy._core._methods", "numpy._core.arrayprint", "numpy._core.printoptions",
             "numpy._core._ufunc_config", "numpy._core._string_helpers")


def preload() -> list[str]:
    """Import the engine's modules now, so nothing the program calls imports later; the names
    of those a program may import."""
    for info in pkgutil.walk_packages(engine.__path__, "engine."):
        importlib.import_module(info.name)
    for name in NUMPY_OWN:
        importlib.import_module(name)
    return [name for name in sys.modules if importable(name)]


def restricted_module(name: str) -> types.ModuleType:
    """A copy of an allowed module holding its public names, less the refused attributes."""
    real = importlib.import_module(name)
    names = getattr(real, "__all__", None) or [n for n in vars(real) if not n.startswith("_")]
    out = types.ModuleType(name)
    for n in names:
        if n.startswith("_") or n in REFUSED_ATTRIBUTES:
            continue
        value = getattr(real, n)
        if isinstance(value, types.ModuleType):
            if name == "numpy" and n in NUMPY_SUBMODULES:
                value = restricted_module(f"numpy.{n}")
            else:
                continue
        setattr(out, n, value)
    setattr(out, "__all__", [n for n in vars(out) if not n.startswith("_")])
    return out


def restricted_builtins(modules: dict[str, types.ModuleType]) -> dict:
    """The builtins a program sees: the safe ones, and an import that hands out the copies."""
    safe = {n: v for n, v in vars(builtins).items() if not n.startswith("_") and n not in REFUSED_NAMES}
    package = types.ModuleType("engine")  # `import engine.ggml` binds this package copy
    for name, mod in modules.items():
        if name.startswith("engine."):
            setattr(package, name.split(".", 1)[1], mod)

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002
        if not level and name in NUMPY_OWN:  # numpy's C code importing its own (loaded) module
            return sys.modules[name]
        if level or name not in modules:
            raise ImportError(f"the playground may import only {', '.join(modules)}, not {name!r}")
        if name.startswith("engine.") and not fromlist:
            return package
        return modules[name]

    safe["__import__"] = guarded_import
    safe["__build_class__"] = builtins.__build_class__  # class statements (a struct, as in C)
    safe["__name__"] = "builtins"
    return safe


def close_the_gate(scratch: Path) -> None:
    """Install the audit hook: from here on, the process may touch only its scratch directory."""
    scratch = scratch.resolve()
    readable = tuple({Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                   Path(engine.__file__).parent, Path(np.__file__).parent,
                                                   bundled.model_path(bundled.data_dir()).parent)})

    def inside(path, roots) -> bool:
        if isinstance(path, int):  # an already open descriptor
            return False
        try:
            p = Path(os.fsdecode(path)).resolve()
        except (TypeError, ValueError, OSError):
            return False
        return any(p == r or r in p.parents for r in roots)

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
                (isinstance(flags, int) and flags & WRITE_FLAGS)
            if not inside(path, (scratch,)) and (writes or not inside(path, readable)):
                raise PermissionError(f"the sandbox refuses to open {path!r}: a program may use files "
                                      f"only in its scratch directory")
        elif event.startswith(REFUSED_EVENTS):
            raise PermissionError(f"the sandbox refuses {event}: no processes, network, C calls or "
                                  f"imports beyond the facades, numpy and math")
        elif event.startswith(PATH_EVENTS):
            if not all(inside(a, (scratch,)) for a in args[:1] if isinstance(a, (str, bytes, os.PathLike))):
                raise PermissionError(f"the sandbox refuses {event} outside the scratch directory")

    sys.addaudithook(hook)


def stop_with(message: str):
    def handler(signum, frame):
        raise ProgramStopped(message)
    return handler


def confine(request: dict) -> None:
    """Before anything of the program is read: mount the scratch directory (confined: bwrap kept
    the worker CAP_SYS_ADMIN for it alone), take the run's own uid (the server is root), drop every
    capability and load the server's seccomp filter on every thread. Any of them failing ends the
    worker."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, scratch = request.get("uid"), request.get("scratch")
    if scratch is not None:
        mount_scratch(libc, scratch, uid)
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # (root's capabilities go with root)
    if scratch is not None:
        os.chdir(scratch["path"])  # (as the uid that owns it; bwrap's working directory is underneath)
        drop_capabilities(libc)
    bpf = base64.b64decode(request.get("seccomp", ""))
    if bpf:
        code = ctypes.create_string_buffer(bpf, len(bpf))
        prog = SockFprog(len(bpf) // 8, ctypes.addressof(code))
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        libc.syscall.restype = ctypes.c_long
        if libc.syscall(ctypes.c_long(int(request["seccomp_nr"])), ctypes.c_long(SECCOMP_SET_MODE_FILTER),
                        ctypes.c_long(SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(prog)) != 0:
            raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER) failed")


def mount_scratch(libc: ctypes.CDLL, scratch: dict, uid: int | None) -> None:
    """A tmpfs of scratch["bytes"] bytes and scratch["inodes"] inodes (files and directories)
    on the empty directory bwrap left at scratch["path"], owned by the run's uid (only it may
    enter: root without CAP_DAC_OVERRIDE cannot)."""
    if not (int(scratch["bytes"]) > 0 and int(scratch["inodes"]) > 0):  # (0 is tmpfs's "unlimited")
        raise ValueError(f"the scratch directory needs a size and an inode count: {scratch}")
    options = f"size={int(scratch['bytes'])},nr_inodes={int(scratch['inodes'])},mode=0700"
    if uid is not None:
        options += f",uid={int(uid)},gid={int(uid)}"
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                           ctypes.c_char_p]
    if libc.mount(b"tmpfs", os.fsencode(scratch["path"]), b"tmpfs", MS_NOSUID | MS_NODEV,
                  options.encode()) != 0:
        raise OSError(ctypes.get_errno(), f"mounting the scratch directory ({options}) failed")


def drop_capabilities(libc: ctypes.CDLL) -> None:
    """capset: no capability left, effective, permitted, inheritable or ambient."""
    header, data = CapHeader(LINUX_CAPABILITY_VERSION_3, 0), (CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def has_capabilities(libc: ctypes.CDLL) -> bool:
    header, data = CapHeader(LINUX_CAPABILITY_VERSION_3, 0), (CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget failed")
    return any(d.effective or d.permitted for d in data)


def check_confinement(request: dict) -> str:
    """'confined' if this process finds every door the boundary closes closed."""
    import socket

    libc = ctypes.CDLL(None, use_errno=True)
    inodes = int(request["scratch"]["inodes"])

    def opens(attempt) -> bool:
        try:
            attempt()
        except OSError:
            return False
        return True

    def fork() -> None:
        if os.fork() == 0:  # (the child of a fork that should not have happened)
            os._exit(0)

    def c_call(name: str, *args) -> int:  # a C library call, its -1 as an OSError
        if (result := getattr(libc, name)(*args)) == -1:
            raise OSError(ctypes.get_errno(), f"{name} failed")
        return result

    new = IPC_CREAT | 0o600
    attempts = {  # door -> an attempt to pass it, an OSError where it is closed
        "a socket": socket.socket,
        "fork": fork,
        "exec": lambda: os.execv("/usr/bin/true", ["true"]),
        "a file outside scratch": lambda: open("/probe", "w"),
        "the host's files": lambda: open("/etc/hostname"),
        "SysV shared memory": lambda: c_call("shmget", IPC_PRIVATE, 4096, new),
        "SysV message queues": lambda: c_call("msgget", IPC_PRIVATE, new),
        "SysV semaphores": lambda: c_call("semget", IPC_PRIVATE, 1, new),
        "POSIX message queues": lambda: c_call("mq_open", b"/probe", os.O_RDWR | os.O_CREAT, 0o600,
                                               None),
        "memfd": lambda: os.memfd_create("probe"),
        "a user namespace": lambda: c_call("unshare", CLONE_NEWUSER),
    }
    states = {  # door -> whether the process's own state leaves it open
        "root": lambda: os.getuid() == 0 or os.geteuid() == 0,
        "a uid not the run's own": lambda: request.get("uid") not in (None, os.getuid()),
        "capabilities": lambda: has_capabilities(libc),
        "a scratch without its inode cap": lambda: not 0 < os.statvfs(".").f_files <= inodes,
    }
    open_doors = [door for door, attempt in attempts.items() if opens(attempt)]
    open_doors += [door for door, is_open in states.items() if is_open()]
    return "confined" if not open_doors else "open: " + ", ".join(open_doors)


def model_names(digest: object) -> Callable[[str], str | None]:
    """The digest the server named the bundled model by, for a path that is the model as this
    worker sees it (bound under /data): the patches that are its pages cross the wire as
    references to it, and every other file's as bytes."""
    model = os.path.realpath(bundled.model_path(bundled.data_dir()))
    return lambda path: digest if isinstance(digest, str) and os.path.realpath(path) == model else None


def main() -> None:
    request = json.loads(sys.stdin.buffer.read(4 << 20))
    out = sys.stdout.buffer
    confine(request)
    if request.get("probe"):
        out.write(check_confinement(request).encode())
        return
    source, n_threads = request["source"], int(request["threads"])
    limits = request["limits"]
    gate = request.get("gate", True)
    printed = BoundedText(int(limits["output"]))
    scratch = Path.cwd()

    # the server checked it, and a worker checks again; only the sandbox's own tests turn the
    # gate off, to show that the kernel boundary alone stops what the gate would have refused
    tree = check_program(source) if gate else ast.parse(source)
    path = scratch / PROGRAM_FILE
    path.write_text(source, encoding="utf-8")
    code = compile(tree, str(path), "exec")
    allowed = preload()
    from engine.trace import record

    namespace: dict[str, Any]  # the program's globals
    if gate:
        modules = {name: restricted_module(name) for name in allowed}
        namespace = {"__name__": "program", "__builtins__": restricted_builtins(modules)}
    else:
        namespace = {"__name__": "program"}

    module = is_module(tree)

    def program(n_threads: int) -> dict:
        namespace["n_threads"] = n_threads  # what a script reads
        exec(code, namespace)  # noqa: S102 - the checked program, under the gate
        if module:
            return namespace["run"](n_threads=n_threads)
        return {name: v for name, v in namespace.items()  # a script's outputs: its tensors with data
                if isinstance(v, Tensor) and not name.startswith("_") and v.data}

    signal.signal(signal.SIGXCPU, stop_with(f"the program used more than {limits['cpu']} s of CPU time"))
    signal.signal(signal.SIGALRM, stop_with(f"the program ran longer than {limits['wall']} s"))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too large file is an OSError, not a kill
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = int(usage.ru_utime + usage.ru_stime)  # the imports' CPU time: the program's comes after
    # the soft limit's SIGXCPU stops the program with its steps kept; the hard limit, a little
    # later, is the kernel's SIGKILL for a program that ignores it
    resource.setrlimit(resource.RLIMIT_CPU, (used + int(limits["cpu"]), used + int(limits["cpu"]) + 2))
    signal.alarm(int(limits["wall"]))
    sys.stdout = sys.stderr = printed
    if gate:
        close_the_gate(scratch)
    trace = record(program, str(path), "program", n_threads, step_cap=int(limits["steps"]))
    signal.alarm(0)
    trace.printed = printed.text()
    try:
        data = encode_trace(trace, model_names(request.get("model")))
    except TypeError as e:
        data = encode_failure(str(e))
    if len(data) > int(limits["trace"]):
        data = encode_failure(f"the trace is {len(data):,} bytes, more than the limit of "
                              f"{int(limits['trace']):,}: record fewer steps or smaller tensors")
    out.write(data)
    out.flush()


if __name__ == "__main__":
    stdout = sys.__stdout__
    assert stdout is not None  # (the server's pipe)
    try:
        main()
    except MemoryError:
        stdout.buffer.write(encode_failure("the program ran out of memory"))
    except BaseException as e:  # noqa: BLE001 - whatever stops the worker, the server is told why
        stdout.buffer.write(encode_failure(f"{type(e).__name__}: {e}"))
    stdout.flush()
    os._exit(0)
