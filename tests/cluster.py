"""Start and stop a throwaway 3-master Redis Cluster on free loopback ports.

Three ``redis-server --cluster-enabled yes`` processes (tests.redis_server's
RedisServer, sharing one temp dir) joined with ``redis-cli --cluster create``,
with no replicas, or ``replicas`` per master.  ``start()`` returns once every
node's ``CLUSTER INFO`` says ``cluster_state:ok``, every node knows all 16384
slots, and every replica's link to its master is up.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

import redis
from redis.crc import key_slot

from tests.redis_server import (
    RedisServer,
    RedisServerNotFound,
    find_redis_server,
    free_port,
    server_version,
)

__all__ = ["LocalCluster", "redis_cli", "unavailable"]


def redis_cli() -> Optional[str]:
    """The redis-cli beside the redis-server the tests start, of its version
    (not the first on PATH: an activated virtualenv's bin/ may hold the
    embedded package's 6.2 copy, which cannot join 7.x nodes)."""
    try:
        cli = Path(find_redis_server()).with_name("redis-cli")
    except RedisServerNotFound:
        return None
    return str(cli) if cli.is_file() else None


def unavailable() -> Optional[str]:
    """Why no cluster can be started here (the tests skip saying so), or None."""
    try:
        binary = find_redis_server()
    except RedisServerNotFound as exc:
        return str(exc)
    if redis_cli() is None:
        return f"redis-cli is not installed beside {binary}: it is needed to create a Redis Cluster"
    version = server_version(binary)
    if version < (7, 0):
        # (The embedded server, when PATH has no redis-server, is 6.2.)
        return (
            "the cluster tests need Redis 7.0 or later (--cluster-port), "
            f"{binary} is {'.'.join(map(str, version))}"
        )
    return None


class LocalCluster:
    """``LocalCluster(3).start()``; ``ports`` are the masters'; ``stop()`` ends it."""

    def __init__(self, masters: int = 3, replicas: int = 0) -> None:
        cli = redis_cli()
        if cli is None:
            raise RuntimeError("redis-cli is not installed (apt-get install redis-tools)")
        self.cli = cli
        self.dir = tempfile.mkdtemp(prefix="redislock-cluster-")
        self.replicas = replicas
        self.servers: list[RedisServer] = []
        #: Master port -> its replicas' ports, once started.
        self.replica_ports: dict[int, list[int]] = {}
        for _ in range(masters * (1 + replicas)):
            server = ClusterNode(self.dir)
            self.servers.append(server)

    @property
    def ports(self) -> list[int]:
        """The masters' ports (every node's before start())."""
        replicas = {p for ports in self.replica_ports.values() for p in ports}
        return [s.port for s in self.servers if s.port not in replicas]

    def start(self, timeout: float = 15.0) -> LocalCluster:
        try:
            for server in self.servers:
                server.start()
            subprocess.run(
                [
                    self.cli,
                    "--cluster",
                    "create",
                    *[f"127.0.0.1:{p}" for p in self.ports],
                    "--cluster-replicas",
                    str(self.replicas),
                    "--cluster-yes",
                ],
                check=True,
                capture_output=True,
                timeout=timeout,
            )
            self._wait_ok(timeout)
            if self.replicas:
                self._wait_replicas(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ok(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        clients = [redis.Redis(port=p, socket_timeout=1) for p in self.ports]
        try:
            while True:
                infos = [c.cluster("INFO") for c in clients]
                if all(_ready(info, len(clients)) for info in infos):
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cluster not ok after {timeout} s: {infos!r}")
                time.sleep(0.05)
        finally:
            for c in clients:
                c.close()

    def _wait_replicas(self, timeout: float) -> None:
        """Learn which node replicates which, and wait for their links."""
        deadline = time.monotonic() + timeout
        while True:
            links: dict[int, list[int]] = {}
            up = True
            for server in self.servers:
                with redis.Redis(port=server.port, socket_timeout=1) as client:
                    info = client.info("replication")
                if info.get("role") == "slave":
                    links.setdefault(int(info["master_port"]), []).append(server.port)
                    up = up and info.get("master_link_status") == "up"
            if up and sum(map(len, links.values())) == len(self.servers) - len(links):
                self.replica_ports = links
                self._acknowledged(deadline)
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster replicas not in sync after {timeout} s: {links}")
            time.sleep(0.05)

    def _acknowledged(self, deadline: float) -> None:
        """One write on each master, waited for by its replicas.  A replica fresh
        from its first sync acknowledges only on its once-a-second timer at
        first (a WAIT then takes up to a second); after this, at once."""
        for master, replicas in self.replica_ports.items():
            key = next(
                f"probe-{i}"
                for i in range(100_000)
                if self.owner(key_slot(f"probe-{i}".encode())) == master
            )
            with redis.Redis(port=master, socket_timeout=5) as client:
                client.set(key, 1)
                left = max(1, int((deadline - time.monotonic()) * 1000))
                if client.wait(len(replicas), left) < len(replicas):
                    raise RuntimeError(f"the replicas of {master} did not acknowledge a write")
                client.delete(key)

    def server(self, port: int) -> RedisServer:
        (found,) = [s for s in self.servers if s.port == port]
        return found

    def owner(self, slot: int) -> int:
        """The port of the master that serves ``slot``."""
        with redis.Redis(port=self.ports[0]) as client:
            for start, end, master, *_ in client.execute_command("CLUSTER SLOTS"):
                if start <= slot <= end:
                    return int(master[1])
        raise LookupError(f"slot {slot} is not served")

    def move_slot(self, slot: int, to_port: int) -> None:
        """Reshard ``slot`` (and its keys) to the master on ``to_port``, as
        ``redis-cli --cluster reshard`` does: IMPORTING/MIGRATING, MIGRATE the
        keys, then give the slot to the new owner on every node."""
        clients = {port: redis.Redis(port=port) for port in self.ports}
        try:
            ids = {port: c.execute_command("CLUSTER MYID").decode() for port, c in clients.items()}
            source, target = clients[self.owner(slot)], clients[to_port]
            source_port = self.owner(slot)
            target.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", ids[source_port])
            source.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", ids[to_port])
            while keys := source.execute_command("CLUSTER GETKEYSINSLOT", slot, 100):
                source.execute_command("MIGRATE", "127.0.0.1", to_port, "", 0, 5000, "KEYS", *keys)
            for port in [to_port, source_port, *self.ports]:
                clients[port].execute_command("CLUSTER SETSLOT", slot, "NODE", ids[to_port])
        finally:
            for c in clients.values():
                c.close()

    def stop(self) -> None:
        for server in self.servers:
            server.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class ClusterNode(RedisServer):
    """A cluster-enabled RedisServer in ``folder``, on a free port and bus port
    (picked again, both, when it does not start on them)."""

    def __init__(self, folder: str) -> None:
        super().__init__()
        os.rmdir(self.dir)
        self.dir = folder
        self._cluster_options()

    def repick(self) -> None:
        super().repick()
        self._cluster_options()

    def _cluster_options(self) -> None:
        self.extra = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            f"{self.dir}/nodes-{self.port}.conf",
            # The bus port defaults to port + 10000, which may be taken or
            # past 65535 for an ephemeral port: pick a free one too.
            "--cluster-port",
            str(free_port()),
            # A replica's first full sync starts at once (Redis 7 waits 5 s).
            "--repl-diskless-sync-delay",
            "0",
        ]


def _ready(info: object, nodes: int) -> bool:
    """Whether a node's ``CLUSTER INFO`` (raw text, or redis-py's dict) says it is ok."""
    if isinstance(info, bytes):
        info = info.decode()
    if isinstance(info, str):
        info = dict(line.split(":", 1) for line in info.split() if ":" in line)
    assert isinstance(info, dict)
    fields = {str(k): str(v) for k, v in info.items()}
    return (
        fields.get("cluster_state") == "ok"
        and fields.get("cluster_slots_ok") == "16384"
        and fields.get("cluster_known_nodes") == str(nodes)
    )
