"""Fixtures and hooks shared by the whole suite.

The run is spread over two processes (pytest-xdist, ``--dist loadgroup``: ``pyproject.toml``).
Every module is one unit of work, so its module-scoped fixtures are set up once and its tests
run in their order; the modules that use vLLM servers are a unit per family (modules joined by
the configurations they share, ``vllm_schedule.families``; each process holds its own server
pool and runs the families it is handed in the planned order), handed out first, the largest
first (:func:`hand_out_order`); the peers' modules are a unit
(their environments and driver processes are set up once). The summary lists every vLLM start
with its CPU seconds and each process's timeline.
"""

from __future__ import annotations

import resource
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from evidence import under_ci
from hypothesis import settings
from vllm_schedule import MARKER, Schedule, check_declared, families, module, order

from tokenkeys.limits import Limits
from tokenkeys.serving.models import ModelRegistry

from support import ServerThread

# The real-vLLM session fixtures (environment, tiny model, server pool), here so that every
# suite shares one pool: tests/realengine and the Engine conformance suite's vLLM case.
from vllm_fixtures import SCHEDULE, tiny_model, vllm_fork_server, vllm_pool, vllm_python  # noqa: F401
from vllm_server import Start

# Hypothesis fails an example that takes over 200 ms by default: a timing in a pass/fail test,
# which a loaded machine trips (test_labelled's first example took 546 ms in a whole run at load
# average 10, then 25 ms when Hypothesis ran it again and called the failure flaky).
settings.register_profile("tokenkeys", deadline=None)
settings.load_profile("tokenkeys")

#: The tiers whose tests are the run's evidence, counted at the end (marker: what it proves).
EVIDENCE = {
    "realengine": "with a real vLLM",
    "peers": "against the peers' own code",
    "package": "from the built wheel in a fresh virtualenv",
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*configs): the vLLM server configurations (vllm_server.ServerConfig) the "
        "test asks the shared pool for; the run is ordered and its servers started by them",
    )


# Before xdist reads the groups into the node ids (it takes them in its own hook of this name),
# so before -m/-k deselection too: that only drops items, the order and groups stay.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    check_declared(items)
    order(items)
    family = families(items)
    groups: dict[str, str] = {}
    for item in items:
        name = module(item)
        if name in family:
            group = family[name]
        elif name.startswith("tests/peers/"):
            group = "peers"
        else:
            group = name
        groups[item.nodeid] = group
        item.add_marker(pytest.mark.xdist_group(group))
    if hasattr(config, "workerinput"):
        hand_out_order(items, groups, set(family.values()))


def hand_out_order(items: list[pytest.Item], groups: dict[str, str], first: set[str]) -> None:
    """Order an xdist worker's collection as the units are to be handed out (xdist hands them in
    collection order: ``--no-loadscope-reorder``): the vLLM families first, the largest first,
    one to each process from the start (each is a long unit: started late, it would end
    alone), then every other unit, the largest first (as xdist's own reorder does: the small
    ones even out the end). The order within a unit stays."""
    size = Counter(groups.values())
    position = {group: index for index, group in enumerate(dict.fromkeys(groups.values()))}

    def rank(item: pytest.Item) -> tuple:
        group = groups[item.nodeid]
        return (group not in first, -size[group], position[group])

    items.sort(key=rank)


def pytest_collection_finish(session: pytest.Session) -> None:
    factory = session.config._tmp_path_factory  # the run's basetemp, kept like tmp_path's
    # An xdist worker begins when it is handed its first vLLM test (``Schedule.at``), and plans
    # only for the families it is handed: the other worker would build and start for nothing.
    worker = hasattr(session.config, "workerinput")
    workspace = factory.mktemp("vllm-schedule", numbered=True)
    schedule = Schedule(session.items, workspace, whole_run=not worker)
    session.config.stash[SCHEDULE] = schedule
    if not session.config.option.collectonly and not worker:
        schedule.begin()


def pytest_runtest_setup(item: pytest.Item) -> None:
    schedule = item.config.stash.get(SCHEDULE, None)
    if schedule is not None:
        schedule.at(item)


def pytest_sessionfinish(session: pytest.Session) -> None:
    schedule = session.config.stash.get(SCHEDULE, None)
    if schedule is not None:
        schedule.close()
        if hasattr(session.config, "workeroutput"):  # to the controller, for the summary
            starts = [(s.label, s.seconds, s.cpu) for s in schedule.starts()]
            session.config.workeroutput["vllm_starts"] = starts


#: The vLLM starts the xdist workers reported (the controller runs no test itself).
STARTS = pytest.StashKey[list]()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:  # noqa: ANN001 - xdist's WorkerController
    starts = getattr(node, "workeroutput", {}).get("vllm_starts", [])
    node.config.stash.setdefault(STARTS, []).extend(Start(*start) for start in starts)


#: Per process (xdist worker id, or "main"): [first start, last stop, seconds in tests,
#: tests, first and last moment in a real-engine test], from the reports this process sees
#: (under xdist the controller's: every worker's).
_TIMELINE: dict[str, list] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    node = getattr(report, "node", None)
    worker = node.gateway.id if node is not None else "main"
    line = _TIMELINE.setdefault(worker, [report.start, report.stop, 0.0, 0, None, None])
    line[0], line[1] = min(line[0], report.start), max(line[1], report.stop)
    line[2] += report.duration
    line[3] += report.when == "call"
    if "realengine" in report.keywords:
        line[4] = report.start if line[4] is None else min(line[4], report.start)
        line[5] = report.stop if line[5] is None else max(line[5], report.stop)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """How many tests of each evidence tier ran, and every vLLM start with its seconds."""
    if config.option.collectonly:
        return
    reporter = terminalreporter
    counts = {name: {"passed": 0, "failed": 0, "skipped": 0} for name in EVIDENCE}
    for outcome in ("passed", "failed", "error", "skipped"):
        for report in reporter.stats.get(outcome, []):
            if getattr(report, "when", None) != "call" and outcome == "passed":
                continue
            # A module that fails to import leaves a CollectReport, which has no keywords: its
            # error is in pytest's own summary, and the tiers count what ran.
            keywords = getattr(report, "keywords", {})
            for name in EVIDENCE:
                if name in keywords:
                    counts[name]["failed" if outcome == "error" else outcome] += 1
    reporter.section("engine evidence")
    for name, what in EVIDENCE.items():
        c = counts[name]
        reporter.line(
            f"{name}: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped ({what})"
        )
    schedule = config.stash.get(SCHEDULE, None)
    # Under xdist the workers' (reported at their end); in one process, its own.
    starts = config.stash.get(STARTS, None) or (schedule.starts() if schedule is not None else [])
    if starts:
        cpu = sum(start.cpu or 0 for start in starts)
        listed = ", ".join(str(start) for start in starts)
        reporter.line(f"vLLM servers started: {len(starts)}, {cpu:.0f} CPU s ({listed})")
    # The run's work whatever else loads the machine: this process and every child it waited
    # for (xdist's workers, and theirs: servers, subprocesses).
    used = sum(
        resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    reporter.line(f"CPU: {used:.0f} s in the run's processes that ended")
    begin = min((line[0] for line in _TIMELINE.values()), default=0.0)
    for worker, (first, last, busy, tests, engine_from, engine_to) in sorted(_TIMELINE.items()):
        engine = (
            f", real-engine tests from {engine_from - begin:.0f} s to {engine_to - begin:.0f} s"
            if engine_from is not None
            else ""
        )
        reporter.line(
            f"{worker}: {tests} tests, {busy:.0f} s in tests, from {first - begin:.0f} s to "
            f"{last - begin:.0f} s{engine}"
        )
    if under_ci():
        reporter.line("CI=true: a missing engine or peer environment fails its tests")


@pytest.fixture
def grpc_server() -> Iterator[Callable[..., ServerThread]]:
    """Factory: ``grpc_server(models, limits=None)`` starts a real server for one test."""
    started: list[ServerThread] = []

    def start(models: ModelRegistry, limits: Limits | None = None) -> ServerThread:
        server = ServerThread(models, limits).__enter__()
        started.append(server)
        return server

    yield start
    for server in started:
        server.__exit__(None, None, None)
