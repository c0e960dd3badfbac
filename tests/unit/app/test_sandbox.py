"""The playground's sandbox against hostile programs.

Each program below is a known way out of a Python sandbox (or a way to hurt the server). Each is
run twice: through the server's check (refused before it runs, with its line), and with the check
skipped (`check=False`), so the worker's own gate — the restricted builtins and imports, the audit
hook, the limits — must stop it on its own. Nothing may escape: no file appears outside the
scratch directory, nothing runs after the point the program was stopped, and the limits end runs
that never end by themselves.
"""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

import pytest

from app.sandbox.check import ProgramRefused, check_program
from app.sandbox.run import Limits, ProgramFailed, TraceUnpickler, run_program

LIMITS = Limits(cpu=4, wall=8, memory=3 << 30, output=10_000, steps=300, trace=8 << 20, file_size=1 << 20)
MARKER = Path("/tmp/ggml-lens-sandbox-escaped")


def program(body: str) -> str:
    return ("import numpy as np\nimport math\n\nfrom engine.ggml import *\n\n\n"
            "def run(n_threads=1):\n" + textwrap.indent(textwrap.dedent(body), "    ") + "\n    return {}\n")


# name -> (an attempt to get out: run a command, write or read a file, reach the network or raw
# memory; the first thing the check refuses in it)
TOUCH = "touch /tmp/ggml-lens-sandbox-escaped"
ESCAPES = {
    # reaching the interpreter through attributes, then os.system
    "subclass walking": (f"""
        for c in ().__class__.__bases__[0].__subclasses__():
            if c.__name__ == '_wrap_close':
                c.__init__.__globals__['system']('{TOUCH}')""", "__class__"),
    "object subclasses": ("""
        for c in object.__subclasses__():
            if c.__name__ == 'Popen':
                c(['touch', '/tmp/ggml-lens-sandbox-escaped'])""", "object"),
    "builtins dict": ("__builtins__['open']('/tmp/ggml-lens-sandbox-escaped', 'w').write('x')", "__builtins__"),
    "import builtin": (f"__import__('os').system('{TOUCH}')", "__import__"),
    "function globals": ("""
        def f(): pass
        f.__globals__['__builtins__']['open']('/tmp/ggml-lens-sandbox-escaped', 'w')""", "__globals__"),
    "frame walking from a traceback": (f"""
        try:
            1 / 0
        except Exception as e:
            f = e.__traceback__.tb_frame
            while f is not None:
                if 'os' in f.f_globals:
                    f.f_globals['os'].system('{TOUCH}')
                f = f.f_back""", "__traceback__"),
    "frame walking to real builtins": ("""
        try:
            1 / 0
        except Exception as e:
            f = e.__traceback__.tb_frame.f_back
            b = f.f_globals['__builtins__']
            b = b if isinstance(b, dict) else b.__dict__
            b['open']('/tmp/ggml-lens-sandbox-escaped', 'w').write('x')""", "__traceback__"),
    "ctypes through the worker's frames": ("""
        try:
            1 / 0
        except Exception as e:
            b = e.__traceback__.tb_frame.f_back.f_globals['__builtins__']
            b = b if isinstance(b, dict) else b.__dict__
            b['__import__']('ctypes').CDLL(None).system(b'touch /tmp/ggml-lens-sandbox-escaped')""", "__traceback__"),
    "a socket through the worker's frames": ("""
        try:
            1 / 0
        except Exception as e:
            b = e.__traceback__.tb_frame.f_back.f_globals['__builtins__']
            b = b if isinstance(b, dict) else b.__dict__
            b['__import__']('socket').create_connection(('127.0.0.1', 9))""", "__traceback__"),
    "killing the server": ("""
        try:
            1 / 0
        except Exception as e:
            os = e.__traceback__.tb_frame.f_back.f_globals['os']
            os.kill(os.getppid(), 9)""", "__traceback__"),
    "generator frame": ("""
        def g():
            yield 1
        g().gi_frame.f_globals['__builtins__']['open']('/tmp/ggml-lens-sandbox-escaped', 'w')""", "generators"),
    "format-string attribute access": ("x = '{0.__class__.__mro__[1].__subclasses__}'.format(1)", "format"),
    "format_map": ("x = '{a.__class__}'.format_map({'a': 1})", "format_map"),
    "getattr with a built name": ("getattr(getattr((), '__cla' + 'ss__'), '__ba' + 'ses__')", "getattr"),
    "globals": ("globals()['__builtins__']['open']('/tmp/ggml-lens-sandbox-escaped', 'w')", "globals"),
    "type three-argument form": ("T = type('T', (), {'x': 1})", "type"),
    "metaclass": ("class M(type): pass\nclass C(metaclass=M): pass", "type"),
    "code object": ("""
        def f(): pass
        x = f.__code__.co_code""", "__code__"),
    "eval": (f"eval(\"__import__('os').system('{TOUCH}')\")", "eval"),
    "exec": (f"exec(\"import os; os.system('{TOUCH}')\")", "exec"),
    "compile": ("x = compile('1', 'f', 'eval')", "compile"),
    "breakpoint": ("breakpoint()", "breakpoint"),
    # importing what is not the facades, numpy or math
    "import os": (f"import os\nos.system('{TOUCH}')", "os"),
    "import ctypes": (f"import ctypes\nctypes.CDLL(None).system(b'{TOUCH}')", "ctypes"),
    "import subprocess": ("import subprocess\nsubprocess.run(['touch', '/tmp/ggml-lens-sandbox-escaped'])", "subprocess"),
    "import socket": ("import socket\nsocket.create_connection(('127.0.0.1', 80))", "socket"),
    "importlib": ("import importlib\nimportlib.import_module('os').system('true')", "importlib"),
    "import hook on sys.meta_path": ("import sys\nsys.meta_path.clear()", "sys"),
    "fork bomb": ("import os\nwhile True:\n    os.fork()", "os"),
    "relative import": ("from . import worker", "import"),
    "engine internals": ("from engine.trace import record", "engine.trace"),
    "numpy submodule import": ("import numpy.ctypeslib", "numpy.ctypeslib"),
    # numpy's ways to files and raw memory
    "numpy ctypeslib": ("x = np.ctypeslib.as_array(0, (8,))", "ctypeslib"),
    "array ctypes pointer": ("x = np.zeros(4).ctypes.data", "ctypes"),
    "numpy fromfile": ("x = np.fromfile('/etc/passwd', dtype=np.uint8)\nprint(x)", "fromfile"),
    "numpy load pickle": ("x = np.load('/tmp/x.npy', allow_pickle=True)", "load"),
    "numpy tofile": ("np.zeros(4).tofile('/tmp/ggml-lens-sandbox-escaped')", "tofile"),
    "numpy memmap": ("x = np.memmap('/tmp/ggml-lens-sandbox-escaped', mode='w+', shape=(4,))", "memmap"),
    "numpy lib": ("x = np.lib.format.open_memmap('/tmp/ggml-lens-sandbox-escaped', mode='w+', shape=(4,))", "lib"),
    "open a file": ("open('/tmp/ggml-lens-sandbox-escaped', 'w').write('x')", "open"),
}

# programs the check lets through, which the worker's limits and audit hook must stop
STOPPED = {
    "infinite loop": ("while True:\n    pass", "CPU time"),
    "busy numpy": ("a = np.ones((2000, 2000))\nwhile True:\n    a = a @ a", "CPU time"),
    "huge allocation": ("a = np.ones(10 * 1024**3, dtype=np.uint8)", "MemoryError"),
    "huge context": ("ctx = ggml_init(ggml_init_params(mem_size=10 * 1024**3, mem_buffer=None, no_alloc=False))\n"
                     "t = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 10)", "MemoryError"),
    "infinite output": ("while True:\n    print('x' * 1000)", "printed more than"),
    "endless steps": ("ctx = ggml_init(ggml_init_params(mem_size=1 << 20, mem_buffer=None, no_alloc=True))\n"
                      "while True:\n    ggml_set_name(ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 1), 'x')", "steps"),
    "file outside the scratch directory": ("ctx = gguf_init_empty()\n"
                                           "gguf_write_to_file(ctx, '/tmp/ggml-lens-sandbox-escaped', False)",
                                           "refuses to open"),
    "reading a file outside": ("ctx = gguf_init_from_file('/etc/hostname', gguf_init_params(no_alloc=True, ctx=None))",
                               "failed to open"),
    "a huge file in the scratch directory": ("ctx = gguf_init_empty()\n"
                                             "gguf_set_arr_data(ctx, 'big', GGUF_TYPE_UINT8, np.zeros(4 << 20, np.uint8), 4 << 20)\n"
                                             "gguf_write_to_file(ctx, 'big.gguf', False)", "Error"),
    "deep recursion": ("def f(n):\n    return f(n + 1)\nf(0)", "RecursionError"),
}

# of these, the ones that only look (their harm would be what they read): at run time they may
# read what they name; the check is what refuses them
PROBES = {"format-string attribute access", "format_map", "code object"}


@pytest.fixture(autouse=True)
def no_marker():
    MARKER.unlink(missing_ok=True)
    yield
    assert not MARKER.exists(), "a program wrote outside its scratch directory"


@pytest.mark.parametrize("name", list(ESCAPES))
def test_escape_is_refused_before_running(name):
    body, word = ESCAPES[name]
    src = program(body)
    with pytest.raises(ProgramRefused) as e:
        check_program(src)
    assert e.value.refusal.line >= 8  # at the program's line, inside run()
    assert word in e.value.refusal.message
    assert "may import only" in e.value.refusal.message  # says what is allowed


@pytest.mark.parametrize("name", [n for n in ESCAPES if n not in PROBES])
def test_escape_is_stopped_by_the_worker_alone(name):
    """With the server's check skipped, the worker's gate stops the same program."""
    body, _ = ESCAPES[name]
    trace = _run_unchecked(program(body))
    assert trace.error is not None, "the program ran to its end"  # (and no_marker: nothing escaped)
    assert trace.steps[-1].kind.value == "error"


@pytest.mark.parametrize("name", list(STOPPED))
def test_limits_stop_the_program_and_keep_its_steps(name):
    body, word = STOPPED[name]
    src = program(body)
    check_program(src)  # nothing in it is refused: the worker must stop it
    started = time.monotonic()
    trace = run_program(src, 1, LIMITS)
    assert time.monotonic() - started < LIMITS.wall + 15
    assert trace.error is not None and word in trace.error, trace.error
    assert trace.steps[-1].kind.value in ("error", "cap")
    assert trace.steps[-1].line >= 8  # at a line of the program


def test_a_stopped_program_keeps_every_step_before_the_limit():
    src = program("ctx = ggml_init(ggml_init_params(mem_size=1 << 16, mem_buffer=None, no_alloc=False))\n"
                  "a = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 4)\n"
                  "ggml_set_name(a, 'a')\n"
                  "while True:\n    pass")
    trace = run_program(src, 1, LIMITS)
    assert "CPU time" in trace.error
    assert [s.call.strip()[:12] for s in trace.steps[:3]] == ["ctx = ggml_i", "a = ggml_new", "ggml_set_nam"]
    state = trace.state_at(len(trace.steps) - 2)
    assert [t.name for t in state.tensors()] == ["a"]


def test_wall_clock_limit_kills_what_ignores_signals():
    """A program stuck where Python cannot raise (one long numpy call) is killed from outside."""
    src = program("a = np.ones((6000, 6000))\nb = a @ a @ a @ a @ a @ a")
    limits = Limits(cpu=1, wall=1, memory=3 << 30, startup=20)
    started = time.monotonic()
    try:
        trace = run_program(src, 1, limits)
        assert "CPU time" in trace.error or "longer than" in trace.error
    except ProgramFailed as e:
        assert "CPU time" in str(e) or "longer than" in str(e)
    assert time.monotonic() - started < limits.startup + limits.wall + 15


def test_the_unpickler_makes_only_trace_records():
    import io
    import pickle

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch /tmp/ggml-lens-sandbox-escaped",))

    with pytest.raises(pickle.UnpicklingError, match="posix.system|os.system"):
        TraceUnpickler(io.BytesIO(pickle.dumps(Evil()))).load()


def test_a_normal_program_runs_like_the_walkthrough():
    """The sandbox records the same trace the walkthrough gives outside it."""
    from engine.programs import PROGRAMS, trace_program

    src = Path(PROGRAMS["views-and-permute"].source_file).read_text()
    inside = run_program(src, 1, LIMITS)
    outside = trace_program("views-and-permute")
    assert inside.error is None
    assert [s.hash_bytes() for s in inside.steps[:-1]] == [s.hash_bytes() for s in outside.steps[:-1]]
    assert inside.outputs == outside.outputs


def _run_unchecked(src: str):
    try:
        return run_program(src, 1, LIMITS, check=False)
    except ProgramFailed as e:  # the worker refused the program before recording (its own check)
        pytest.fail(f"no trace: {e}")
