"""vLLM servers forked from a process that imported vLLM once.

Importing ``vllm.entrypoints.openai.api_server`` costs about 13 of the 23-26 CPU seconds of a
tiny server's start here (torch, torch._dynamo and _inductor, transformers, openai's types), and
the suite starts about twenty. A fork server pays it once per test process: it is started with
the engine environment's Python running this file, imports the module, then forks a child per
start that runs the module as ``python -m`` would (``runpy``, ``__main__``) with the start's
arguments, environment, working directory and log. The child is the same code in the same
state a fresh interpreter reaches after the same import, with these differences, all outside
what vLLM serves:

- The environment is the start's from the fork on (vLLM reads its variables when it uses them:
  ``vllm.envs`` is lazy until the engine core enables its cache after the fork). What the import
  itself read is the fork server's environment: the options every start shares. Of the
  variables the harness varies per configuration, vLLM 0.32 reads one at import time,
  ``VLLM_SERVER_DEV_MODE``, as the default of ``--log-error-stack``; the harness passes that
  option explicitly (``VllmServer.entry``).
- Python's own ``str`` hash seed is the fork server's (vLLM's ``PYTHONHASHSEED`` use, the root of
  its block hashes, reads the variable at run time: ``v1/core/kv_cache_utils.py``).
- The child starts its engine core by forking itself, where vLLM's CPU platform would spawn a
  fresh interpreter that imports torch and vLLM again (:func:`_fork_the_engine_core`): the
  engine core then costs no import either. Both halves measured on ``test_vllm_keys``' four
  servers: 7-8 CPU s per start, against 17-23 with the engine core spawned.

The child becomes the leader of a session of its own (as ``start_new_session`` makes a spawned
server), so the harness stops it with its group and counts its CPU by session as before, and it
dies with the fork server (``PR_SET_PDEATHSIG``), which dies with the test process. The fork
server reaps its children and tells the harness each one's exit status on the connection that
asked for it; :class:`ForkedProcess` reads it there, as ``subprocess.Popen`` does ``waitpid``.

A child may run another module of the same environment than the one imported (``vllm launch
render``'s, which needs part of that import and no engine core): the state it starts from is the
fresh interpreter's after the fork server's import, then the module's own import, the same code
in a superset of modules, none of which registers anything the render reads.

Run as a script (in the engine environment, standard library only):
``python vllm_forkserver.py SOCKET MODULE``; or ``python vllm_forkserver.py --run MODULE
ARGS...`` to run one server in this process, its engine core forked (:func:`run`: a server of
another environment, vLLM's gRPC launcher, which no fork server imported).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import runpy
import select
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def terminate_with_parent() -> None:
    """SIGTERM when the parent dies, even by SIGKILL (``PR_SET_PDEATHSIG``; the parent is the
    thread that started this process): no vLLM outlives an interrupted session (its API server
    then stops its engine core). Called in a child before exec, or after fork."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


# ---------------------------------------------------------------------- the test process's side


class ForkedProcess:
    """A server forked by a :class:`ForkServer`, with the part of ``subprocess.Popen``'s
    interface the harness uses: ``pid``, ``returncode``, ``poll()``, ``wait(timeout)``.

    The fork server answers a start with one line ``{"pid": N}`` once it has forked (after its
    import, for the first start), and one line ``{"exit": CODE}`` when it has reaped the child
    (``CODE`` as ``Popen.returncode``: negative for a signal)."""

    def __init__(self, connection: socket.socket, args: list[str]):
        self.args = args
        self.returncode: int | None = None
        self._connection = connection
        self._pending = b""
        self._pid: int | None = None

    @property
    def pid(self) -> int:
        """The server's process id (waits for the fork server to have forked it)."""
        while self._pid is None:
            if not self._read(timeout=None):
                raise RuntimeError("the vLLM fork server closed before it forked the server")
        return self._pid

    def poll(self) -> int | None:
        """The exit status if the server has exited, else None."""
        while self.returncode is None and self._read(timeout=0):
            pass
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the server to exit; ``subprocess.TimeoutExpired`` after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._read(timeout=left)
        return self.returncode

    def _read(self, timeout: float | None) -> bool:
        """Take what the fork server has said within ``timeout``; False if it had nothing new."""
        if self._connection.fileno() < 0:
            return False
        ready, _, _ = select.select([self._connection], [], [], timeout)
        if not ready:
            return False
        data = self._connection.recv(4096)
        if not data:  # the fork server is gone, and its children with it (PR_SET_PDEATHSIG)
            self._connection.close()
            if self.returncode is None:
                self.returncode = -signal.SIGTERM
            return True
        self._pending += data
        while b"\n" in self._pending:
            line, self._pending = self._pending.split(b"\n", 1)
            message = json.loads(line)
            if "pid" in message:
                self._pid = message["pid"]
            if "exit" in message:
                self.returncode = message["exit"]
                self._connection.close()
        return True


class ForkServer:
    """A process of ``python`` that imported ``module`` and forks a server per :meth:`spawn`."""

    def __init__(self, python: Path, module: str, env: dict[str, str], log_dir: Path):
        self.python, self.module = python, module
        # A folder of its own under /tmp: a socket's path has a limit of 107 bytes.
        self._socket = Path(tempfile.mkdtemp(prefix="vllm-fork-")) / "socket"
        self.log_path = log_dir / f"vllm-forkserver-{os.getpid()}.log"
        with open(self.log_path, "wb") as log:
            self._process = subprocess.Popen(
                [str(python), __file__, str(self._socket), module],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=terminate_with_parent,
            )

    @property
    def pid(self) -> int:
        """The fork server's process id (the leader of its session)."""
        return self._process.pid

    def spawn(
        self, args: list[str], env: dict[str, str], log_path: Path, module: str | None = None
    ) -> ForkedProcess:
        """Fork a server that runs ``module`` (``self.module`` unless named) with ``args``
        (``sys.argv[1:]``) in ``env``, its output to ``log_path``; returns at once (the fork may
        wait for the import)."""
        module = module or self.module
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        while True:
            try:
                connection.connect(str(self._socket))
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if self._process.poll() is not None:
                    connection.close()
                    raise RuntimeError(
                        f"the vLLM fork server exited with {self._process.returncode}: "
                        f"{self.log_path}:\n{self.log_path.read_text(errors='replace')[-3000:]}"
                    ) from None
                time.sleep(0.05)  # it binds before its import: a moment after its start
        request = {
            "module": module, "args": args, "env": env, "cwd": os.getcwd(), "log": str(log_path)
        }  # fmt: skip
        connection.sendall(json.dumps(request).encode() + b"\n")
        return ForkedProcess(connection, [str(self.python), "-m", module, *args])

    def close(self) -> None:
        """Stop the fork server (its servers die with it)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signal.SIGKILL)
        self._process.wait()
        self._socket.unlink(missing_ok=True)
        self._socket.parent.rmdir()


# ---------------------------------------------------------------------- the fork server's side


def _become(request: dict) -> None:
    """In the forked child: take the start's session, output, environment and directory."""
    os.setsid()
    terminate_with_parent()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.path[0] = os.getcwd()  # as ``python -m`` from the start's working directory
    sys.argv = ["-m", *request["args"]]


def _fork_the_engine_core() -> None:
    """Start the engine core by forking this server, not by spawning a fresh interpreter.

    vLLM's CPU platform chooses ``spawn`` for the processes it starts (``platforms/cpu.py``
    sets ``VLLM_WORKER_MULTIPROC_METHOD``, for OpenMP thread pools a fork would copy), and a
    spawned engine core imports torch and vLLM again: about half of a tiny server's start.
    Here the server has run no OpenMP region with more than one thread (``OMP_NUM_THREADS=1``,
    ``engine_env``), so a forked engine core is the spawned one's code and state without the
    import; vLLM forks this same process on its other platforms (``get_mp_context``'s default).
    The engine core receives the same configuration object (spawn pickles it, fork copies it)."""
    import multiprocessing

    import vllm.v1.engine.utils as engine_utils

    fork = multiprocessing.get_context("fork")
    engine_utils.get_mp_context = lambda: fork


def _run_as_main(module: str) -> None:
    """Run ``module`` as ``python -m`` would, its engine core forked, and exit."""
    _fork_the_engine_core()
    # As ``python -m``: an exception or SystemExit ends the process through the interpreter's
    # own exit (threads joined, atexit handlers run: vLLM's and multiprocessing's, which reaps
    # the engine core).
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    sys.exit(0)


def run(module: str, args: list[str]) -> None:
    """Run one server of ``module`` with ``args`` in this process (``--run``)."""
    sys.path[0] = os.getcwd()  # as ``python -m``: this file's folder must not shadow vLLM's
    sys.argv = ["-m", *args]
    _run_as_main(module)


def serve(path: str, module: str) -> None:
    """Import ``module``, then fork a child per request on the socket at ``path``."""
    sys.path[0] = os.getcwd()  # this file's folder must not shadow what vLLM imports
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    import importlib

    importlib.import_module(module)
    # What it imported stays; the module itself runs afresh as ``__main__`` in each child, as
    # under ``python -m`` (where it is never imported under its own name).
    del sys.modules[module]
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj is listener:
                connection, _ = listener.accept()
                reader = connection.makefile("rb")
                request = json.loads(reader.readline())
                reader.close()
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    for fd in (listener, wake_read, wake_write, *children.values()):
                        os.close(fd) if isinstance(fd, int) else fd.close()
                    _become(request)
                    _run_as_main(request["module"])
                children[pid] = connection
                connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            else:
                os.read(wake_read, 4096)
                while children:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                    if pid == 0:
                        break
                    connection = children.pop(pid, None)
                    if connection is not None:
                        with contextlib.suppress(OSError):
                            message = {"exit": os.waitstatus_to_exitcode(status)}
                            connection.sendall(json.dumps(message).encode() + b"\n")
                        connection.close()


if __name__ == "__main__":
    if sys.argv[1] == "--run":
        run(sys.argv[2], sys.argv[3:])
    else:
        serve(sys.argv[1], sys.argv[2])
