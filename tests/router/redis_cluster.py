"""A real Redis Cluster on loopback for the tests: 3 masters, one replica each.

Six ``redis-server`` processes in cluster mode (Debian's redis-server 7.0 supports
``--cluster-enabled yes``), joined by ``redis-cli --cluster create ... --cluster-replicas 1``
(Debian's package ships redis-cli beside the server), each with a data port and a cluster-bus
port, all distinct, picked by ``free_port`` (``cluster-port``, Redis 7.0+, so the bus never
lands on ``port + 10000`` inside the ephemeral range). No persistence; everything lives in one
temporary directory removed afterwards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

import redis
from ports import free_port

MASTERS = 3


def _distinct_ports(n: int) -> list[int]:
    """``n`` different ports, each free now."""
    ports: list[int] = []
    while len(ports) < n:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


class RedisClusterServers:
    """Six cluster-mode servers (3 masters + 3 replicas) and the cluster they form."""

    def __init__(self, server: str, cli: str, replicas: int = 1) -> None:
        self.server = server
        self.cli = cli
        #: Replicas per master (the bench's largest fleet runs without: memory).
        self.replicas_per_master = replicas
        self.dir = tempfile.mkdtemp(prefix="tokenkeys-cluster-")
        # Data and cluster-bus ports, all distinct: picked one by one, a bus port once equalled
        # another node's data port, which then failed to start ("Address already in use").
        nodes = (1 + replicas) * MASTERS
        picked = _distinct_ports(2 * nodes)
        self.ports, self._bus_ports = picked[:nodes], picked[nodes:]
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        """A URL naming one node (any node will do: the client learns the rest)."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def urls(self) -> list[str]:
        return [f"redis://127.0.0.1:{port}/0" for port in self.ports]

    def start(self) -> RedisClusterServers:
        """Start the nodes and form the cluster; on any failure none stays running."""
        try:
            for port, bus_port in zip(self.ports, self._bus_ports, strict=True):
                node_dir = os.path.join(self.dir, str(port))
                os.mkdir(node_dir)
                args = [self.server, "--port", str(port), "--bind", "127.0.0.1"]
                args += ["--cluster-enabled", "yes", "--cluster-port", str(bus_port)]
                args += ["--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "3000"]
                args += ["--save", "", "--appendonly", "no", "--dir", node_dir]
                with open(os.path.join(node_dir, "redis.log"), "ab") as out:
                    self.procs.append(subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT))
            for port in self.ports:
                self._wait(lambda c: c.ping(), port, "start")
            nodes = [f"127.0.0.1:{port}" for port in self.ports]
            create = [self.cli, "--cluster", "create", *nodes]
            create += ["--cluster-replicas", str(self.replicas_per_master)]
            subprocess.run(
                [*create, "--cluster-yes"],
                check=True,
                capture_output=True,
                timeout=60,
            )
            for port in self.ports:
                self._wait(self._ready, port, "form")
        except BaseException:
            self.remove()
            raise
        return self

    @staticmethod
    def _ready(client: redis.Redis) -> bool:
        reply = client.execute_command("CLUSTER", "INFO")
        text = reply.decode() if isinstance(reply, bytes) else str(reply)
        return "cluster_state:ok" in text and "cluster_slots_ok:16384" in text

    def _wait(self, check, port: int, what: str, timeout: float = 30) -> None:
        client = redis.Redis(port=port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    if check(client):
                        return
                except redis.exceptions.RedisError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis cluster node {port} did not {what}: {self.log()}")
                time.sleep(0.05)
        finally:
            client.close()

    def log(self) -> str:
        tails = []
        for port in self.ports:
            path = os.path.join(self.dir, str(port), "redis.log")
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    tails.append(f"--- {port}\n{f.read()[-800:]}")
        return "\n".join(tails)

    def replicas(self) -> list[int]:
        """Ports of the nodes that are replicas now."""
        out = []
        for port in self.ports:
            client = redis.Redis(port=port)
            try:
                if client.info("replication")["role"] == "slave":
                    out.append(port)
            finally:
                client.close()
        return out

    def failover(self, replica_port: int, timeout: float = 60) -> None:
        """``CLUSTER FAILOVER`` on a replica, then wait until it is a master seen by all.

        A manual failover the replica cannot finish in time (its election needs the votes of
        most masters, which a busy machine may delay) is aborted by Redis after 5 s; it is
        asked again then.
        """
        client = redis.Redis(port=replica_port)
        deadline = time.monotonic() + timeout
        try:
            while client.info("replication").get("master_link_status") != "up":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"replica {replica_port} never synced: {self.log()}")
                time.sleep(0.05)
            while client.info("replication")["role"] != "master":
                client.execute_command("CLUSTER", "FAILOVER")
                asked = time.monotonic()
                while client.info("replication")["role"] != "master":
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"failover of {replica_port} did not finish")
                    if time.monotonic() - asked > 6:
                        break
                    time.sleep(0.05)
        finally:
            client.close()
        for port in self.ports:
            self._wait(self._ready, port, "settle after the failover")

    def remove(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def drop_namespaces(url: str, namespaces: list[str]) -> None:
    """Delete the keys of test namespaces, on every master when ``url`` is a cluster node."""
    client = redis.Redis.from_url(url)
    try:
        if client.info("cluster").get("cluster_enabled"):
            client.close()
            client = redis.RedisCluster.from_url(url)
            nodes = client.get_primaries()
        else:
            nodes = [None]
        for namespace in namespaces:
            for node in nodes:
                pattern = f"{{{namespace}*"
                found = (
                    client.scan_iter(match=pattern, count=1000, target_nodes=node)
                    if node is not None
                    else client.scan_iter(match=pattern, count=1000)
                )
                for key in list(found):
                    client.delete(key)
    finally:
        client.close()
