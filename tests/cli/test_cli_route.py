"""``tokenkeys route`` as a process in front of three ``tokenkeys serve`` processes."""

from __future__ import annotations

import argparse
import time

import httpx
from engine_stack import ServeProcess
from route_process import RouteProcess

from tokenkeys.cli import main
from tokenkeys.cli.route import config_from, register
from tokenkeys.router.policy.cost import CostWeights


def test_route_in_front_of_serve_processes(tmp_path):
    engines = [ServeProcess() for _ in range(3)]
    try:
        for engine in engines:
            engine.__enter__()
        workers = [a for e in engines for a in ("--worker", e.target)]
        with RouteProcess(*workers, cache=str(tmp_path / "cache")) as router:
            assert sum(line.endswith("ready (smollm2-135m-instruct)") for line in router.lines) == 3
            assert any(line.startswith("pool smollm2-135m-instruct") for line in router.lines)
            messages = [{"role": "system", "content": "You answer questions about trains. " * 8}]
            served_by, cached = set(), []
            with httpx.Client(base_url=router.url, timeout=30) as client:
                for turn in range(3):
                    messages.append({"role": "user", "content": f"Turn {turn}: a train to Elm?"})
                    if turn:  # wait until the previous turn's events reached the router
                        for _ in range(500):
                            decision = client.post("/router/route", json={"messages": messages})
                            if decision.json()["reason"] == "prefix":
                                break
                            time.sleep(0.01)
                    response = client.post(
                        "/v1/chat/completions", json={"messages": messages, "max_tokens": 4}
                    )
                    assert response.status_code == 200, response.text
                    if turn:
                        assert response.headers["x-tokenkeys-reason"] == "prefix"
                        assert response.headers["x-tokenkeys-worker"] == decision.json()["worker"]
                    body = response.json()
                    served_by.add(response.headers["x-tokenkeys-worker"])
                    cached.append(body["usage"]["prompt_tokens_details"]["cached_tokens"])
                    reply = body["choices"][0]["message"]["content"]
                    messages.append({"role": "assistant", "content": reply})
                metrics = client.get("/metrics").text
            assert len(served_by) == 1 and served_by <= {e.target for e in engines}
            assert all(c > 0 for c in cached[1:])
            assert 'tokenkeys_router_decisions_total{model="smollm2-135m-instruct"' in metrics
        assert router.proc.returncode == 0
    finally:
        for engine in engines:
            engine.stop()


def test_route_refuses_bad_options(capsys):
    assert main(["route", "--worker", "nohost"]) == 2
    assert "HOST:PORT" in capsys.readouterr().err
    assert main(["route", "--worker", "127.0.0.1:1", "--index", "redis"]) == 2
    assert "--redis-url" in capsys.readouterr().err
    assert main(["route", "--worker", "127.0.0.1:1", "--growth-weight", "-1"]) == 2
    assert "--growth-weight must be a finite number >= 0, got -1.0" in capsys.readouterr().err
    assert main(["route", "--worker", "127.0.0.1:1", "--router-temperature", "nan"]) == 2
    assert "--router-temperature must be a finite number >= 0" in capsys.readouterr().err
    assert main(["route", "--worker", "127.0.0.1:1", "--overflow-weight", "-0.5"]) == 2
    assert "--overflow-weight must be a finite number >= 0" in capsys.readouterr().err
    assert main(["route", "--worker", "127.0.0.1:1", "--replica-slack", "-1"]) == 2
    assert "--replica-slack must be a finite number >= 0" in capsys.readouterr().err
    # The run options are checked as serve checks them (one check, cli/run_options).
    assert main(["route", "--worker", "127.0.0.1:1", "--shutdown-timeout", "-1"]) == 2
    assert "--shutdown-timeout must be >= 0" in capsys.readouterr().err


def test_route_cost_options_reach_the_router_config():
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(
        ["route", "--worker", "127.0.0.1:1", "--prefix-weight", "2", "--load-weight", "0.5"]
        + ["--overflow-weight", "3", "--growth-weight", "0", "--router-temperature", "0.3"]
        + ["--replica-slack", "2"]
    )
    config = config_from(args)
    assert config.router.cost == CostWeights(
        prefix=2.0, load=0.5, overflow=3.0, growth=0.0, temperature=0.3, replica_slack=2.0
    )
    assert config_from(parser.parse_args(["route", "--worker", "h:1"])).router.cost == CostWeights()
