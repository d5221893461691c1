"""Start and stop a throwaway Redis Sentinel topology on free loopback ports.

One master and one replica (tests.redis_server's RedisServer, the replica
started with ``--replicaof``), watched by three ``redis-server <conf>
--sentinel`` processes under the service name ``mymaster`` with quorum 2.
Each sentinel gets a config file of its own in a temp dir (sentinel rewrites
it).  ``start()`` returns once the replica is in sync and every sentinel
knows the master, the replica and the two other sentinels.

``failover()`` runs ``SENTINEL FAILOVER mymaster`` on one sentinel and
returns once the failover is complete as a client sees it: every sentinel
names the promoted server, that server answers ``ROLE`` as a master, and the
old master has been turned into its replica by the sentinels (a manual
failover does not stop the old master: it keeps taking writes until a
sentinel reconfigures it) and is in sync with it.

Sentinel's timers are tuned for production: it re-reads a replica's INFO
every 10 s, and reconfigures a demoted master only after it has reported the
wrong role for 4 hello periods (8 s), so a failover takes over 10 s.  With
``fast=True`` (the default) each sentinel is given shorter periods with
``SENTINEL DEBUG info-period/publish-period`` (Redis >= 7.0), which brings a
failover down to about 2.5 s; on an older Redis that is skipped.  Both data
servers run with ``repl-diskless-sync-delay 0`` (Redis 7 waits 5 s before a
full sync by default).  A server counts as down after 5 s without an answer
(``down-after-milliseconds``): the tests only fail over on purpose, and on a
loaded machine a server that stalls for a second must not be failed over
(or failed back) by the sentinels behind a test's back.  ``failover()``
returns a :class:`Failover` with the instants it saw, including how long both
servers answered as masters.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from tests.redis_server import (
    RedisServer,
    RedisServerNotFound,
    find_redis_server,
    free_port,
    server_version,
)

__all__ = ["Failover", "LocalSentinel", "SentinelUnavailable", "sentinel_client"]

SERVICE = "mymaster"


class SentinelUnavailable(RuntimeError):
    """redis-server is not installed: the fixture skips."""


@dataclass
class Failover:
    """What one ``failover()`` did, with ``time.monotonic()`` instants."""

    old: int
    new: int
    #: When ``SENTINEL FAILOVER`` was sent.
    started: float
    #: First seen answering ROLE as a master (sentinel sent it ``REPLICAOF NO ONE``).
    promoted: float = 0.0
    #: Every sentinel names ``new`` as the master.
    switched: float = 0.0
    #: ``old`` first seen answering ROLE as a replica (a sentinel reconfigured it,
    #: and closed its clients' connections).
    demoted: float = 0.0
    #: ``old`` in sync with ``new`` (link up), and every sentinel sees it as a
    #: healthy replica: ready for the next failover.
    settled: float = 0.0
    #: Scripts (EVALSHA) the old master ran after ``new`` was promoted and
    #: before it was demoted, as polled: writes it took that were then lost.
    old_master_scripts: int = 0
    events: list[str] = field(default_factory=list)

    @property
    def split_brain(self) -> float:
        """How long both servers answered as masters: writes sent to the old
        master in that time were taken, then discarded when it resynced."""
        return self.demoted - self.promoted

    @property
    def seconds(self) -> float:
        return self.settled - self.started


class LocalSentinel:
    """``LocalSentinel().start()``; ``master_port()``, ``failover()``, ``stop()``."""

    def __init__(
        self,
        sentinels: int = 3,
        *,
        fast: bool = True,
        down_after_ms: int = 5000,
        failover_timeout_ms: int = 5000,
    ) -> None:
        try:
            binary = find_redis_server()
        except RedisServerNotFound as exc:
            raise SentinelUnavailable(str(exc)) from exc
        version = server_version(binary)
        if version < (7, 0):
            # Without SENTINEL DEBUG (7.0) a failover takes over 10 s: past the
            # tests' timeouts.  The embedded server (no redis-server on PATH) is 6.2.
            raise SentinelUnavailable(
                f"the Sentinel tests need Redis 7.0 or later (SENTINEL DEBUG), "
                f"{binary} is {'.'.join(map(str, version))}"
            )
        self.binary = binary
        self.fast = fast
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.dir = tempfile.mkdtemp(prefix="redislock-sentinel-")
        # Either may become the master: neither waits 5 s (Redis 7's default)
        # for more replicas before starting a full sync.
        sync = ["--repl-diskless-sync-delay", "0"]
        # (Ports given, so that neither moves to another: each is named below.)
        self.master = RedisServer(free_port(), extra=sync)
        replica_of = ["--replicaof", "127.0.0.1", str(self.master.port)]
        self.replica = RedisServer(free_port(), extra=[*sync, *replica_of])
        #: Both data servers, by port (which one is master changes with failovers).
        self.servers = {s.port: s for s in (self.master, self.replica)}
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.failovers: list[Failover] = []

    # -- lifecycle -------------------------------------------------------------

    @property
    def server_ports(self) -> list[int]:
        return list(self.servers)

    @property
    def sentinels(self) -> list[tuple[str, int]]:
        """The addresses to give ``redis.sentinel.Sentinel``."""
        return [("127.0.0.1", p) for p in self.sentinel_ports]

    def start(self, timeout: float = 15.0) -> LocalSentinel:
        deadline = time.monotonic() + timeout
        try:
            self.master.start()
            self.replica.start()
            self._wait(
                lambda: _link_up(self.replica.port, self.master.port),
                deadline,
                "the replica to sync",
            )
            for port in self.sentinel_ports:
                self._start_sentinel(port)
            self._wait(
                lambda: all(
                    self._sees(p, self.master.port, self.replica.port) for p in self.sentinel_ports
                ),
                deadline,
                "the sentinels to see the master, the replica and each other",
            )
        except BaseException:
            self.stop()
            raise
        return self

    def _start_sentinel(self, port: int) -> None:
        conf = os.path.join(self.dir, f"sentinel-{port}.conf")
        with open(conf, "w") as f:
            f.write(
                f"port {port}\n"
                "bind 127.0.0.1\n"
                f"dir {self.dir}\n"
                f"logfile {self.dir}/sentinel-{port}.log\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE} {self.failover_timeout_ms}\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
        self.procs[port] = subprocess.Popen(
            [self.binary, conf, "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = self._sentinel(port, socket_connect_timeout=0.2)
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    if time.monotonic() > deadline or self.procs[port].poll() is not None:
                        raise RuntimeError(f"sentinel did not start on port {port}") from None
                    time.sleep(0.02)
            if self.fast:
                # Re-read INFO every 200 ms (not 10 s); say hello every 250 ms
                # (not 2 s), which also makes a demoted master wait 1 s (not
                # 8 s) before it is reconfigured as a replica.  Redis < 7.0
                # has no SENTINEL DEBUG: production timers, slower failovers.
                with contextlib.suppress(redis.ResponseError):
                    client.execute_command(
                        "SENTINEL", "DEBUG", "info-period", 200, "publish-period", 250
                    )
        finally:
            client.close()

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
        self.procs.clear()
        for server in self.servers.values():
            server.kill()
            shutil.rmtree(server.dir, ignore_errors=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- what the sentinels say ------------------------------------------------

    def _sentinel(self, port: int, **kwargs: Any) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=1, decode_responses=True, **kwargs)

    def _ask(self, port: int, *args: Any) -> Any:
        client = self._sentinel(port)
        try:
            return client.execute_command("SENTINEL", *args)
        finally:
            client.close()

    def master_port(self, sentinel: Optional[int] = None) -> int:
        """The master's port, as a sentinel (the first that answers) names it."""
        error: Optional[Exception] = None
        for port in [sentinel] if sentinel else self.sentinel_ports:
            try:
                reply = self._ask(port, "GET-MASTER-ADDR-BY-NAME", SERVICE)
            except redis.ConnectionError as exc:
                error = exc
                continue
            if reply:
                return int(reply[1])
        raise RuntimeError(f"no sentinel names a master for {SERVICE}: {error!r}")

    def replica_port(self) -> int:
        master = self.master_port()
        (other,) = [p for p in self.servers if p != master]
        return other

    def _sees(self, sentinel: int, master: int, replica: int) -> bool:
        """Whether ``sentinel`` knows ``master`` as master, ``replica`` as a good
        replica of it, and the other sentinels."""
        try:
            info = _pairs(self._ask(sentinel, "MASTER", SERVICE))
            replicas = [_pairs(r) for r in self._ask(sentinel, "REPLICAS", SERVICE)]
        except redis.RedisError:
            return False
        if int(info.get("port", 0)) != master or info.get("flags") != "master":
            return False
        if int(info.get("num-other-sentinels", 0)) < len(self.sentinel_ports) - 1:
            return False
        return any(
            int(r.get("port", 0)) == replica
            and r.get("flags") == "slave"
            and r.get("role-reported") == "slave"
            and r.get("master-link-status") == "ok"
            and int(r.get("master-port", 0)) == master
            for r in replicas
        )

    # -- failover ----------------------------------------------------------------

    def failover(self, timeout: float = 15.0, *, in_sync: bool = True) -> Failover:
        """``SENTINEL FAILOVER`` on one sentinel; returns once the other server is
        the master everywhere and the old master is its replica, in sync.

        Sentinel does not wait for the replica to catch up before promoting
        it: writes it has not received yet are lost (replication is
        asynchronous; ``wait_replicas`` is the library's answer to that).
        With ``in_sync`` (the default) the failover starts only once the
        replica has every write the master had taken when it was called, so
        that a test sees what a failover does to clients, not that loss.
        """
        old = self.master_port()
        (new,) = [p for p in self.servers if p != old]
        if in_sync:
            taken = int(_info(old, "replication").get("master_repl_offset", 0))
            self._wait(
                lambda: (
                    _link_up(new, old)
                    and int(_info(new, "replication").get("slave_repl_offset", 0)) >= taken
                ),
                time.monotonic() + timeout,
                f"the replica {new} to catch up with the master {old} (offset {taken})",
            )
        record = Failover(old=old, new=new, started=time.monotonic())
        deadline = record.started + timeout
        asked = self.sentinel_ports[len(self.failovers) % len(self.sentinel_ports)]
        while True:
            try:
                self._ask(asked, "FAILOVER", SERVICE)
                break
            except redis.ResponseError as exc:
                # NOGOODSLAVE: the replica's INFO is not fresh yet; INPROG: the
                # last failover has not finished on that sentinel.
                record.events.append(f"{time.monotonic() - record.started:.3f}: {exc}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"SENTINEL FAILOVER refused: {exc}") from exc
                time.sleep(0.05)
        # One loop polls everything, so that each instant is seen within a poll.
        scripts_at_promotion: Optional[int] = None
        while not record.settled:
            now = time.monotonic()
            try:
                if not record.promoted and _role(new) == ("master", None):
                    record.promoted = now
                if record.promoted and not record.demoted:
                    scripts = _evalsha_calls(old)
                    if _role(old) == ("slave", new):
                        record.demoted = now
                    else:  # (counted while it was still a master)
                        if scripts_at_promotion is None:
                            scripts_at_promotion = scripts
                        record.old_master_scripts = scripts - scripts_at_promotion
                if not record.switched and all(
                    self.master_port(p) == new for p in self.sentinel_ports
                ):
                    record.switched = now
                if (
                    record.promoted
                    and record.demoted
                    and record.switched
                    and _link_up(old, new)
                    and all(self._sees(p, new, old) for p in self.sentinel_ports)
                ):
                    record.settled = time.monotonic()
                    break
            except (redis.RedisError, RuntimeError):
                pass
            if now > deadline:
                raise RuntimeError(
                    f"failover {old} -> {new} incomplete after {timeout} s: {record}"
                    f"{self._log_tail()}"
                )
            time.sleep(0.01)
        self.failovers.append(record)
        return record

    def _wait(self, predicate: Any, deadline: float, what: str) -> None:
        while True:
            try:
                if predicate():
                    return
            except (redis.RedisError, RuntimeError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}{self._log_tail()}")
            time.sleep(0.02)

    def _log_tail(self, lines: int = 15) -> str:
        out = []
        for port in self.sentinel_ports:
            path = os.path.join(self.dir, f"sentinel-{port}.log")
            try:
                with open(path) as f:
                    tail = f.readlines()[-lines:]
            except OSError:
                continue
            out.append(f"\n--- sentinel {port} ---\n" + "".join(tail))
        return "".join(out)


def sentinel_client(
    topology: LocalSentinel, sentinel: Optional[Sentinel] = None
) -> tuple[Sentinel, redis.Redis]:
    """A client on the master, built the way users build one: through the
    sentinels (``sentinel``'s, else new ones), with a retry policy (so that
    every connection asks the sentinels where the master is whenever it
    connects)."""
    sentinel = sentinel or Sentinel(topology.sentinels, socket_timeout=1)
    client = sentinel.master_for(
        SERVICE,
        socket_timeout=1,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 10),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError],
    )
    return sentinel, client


def _pairs(reply: Any) -> dict[str, str]:
    """A sentinel's flat field/value list (or redis-py's dict of it) as a dict."""
    if isinstance(reply, dict):
        return {str(k): str(v) for k, v in reply.items()}
    return {str(reply[i]): str(reply[i + 1]) for i in range(0, len(reply) - 1, 2)}


def _info(port: int, section: str) -> dict[str, Any]:
    client = redis.Redis(port=port, socket_timeout=1)
    try:
        return dict(client.info(section))
    finally:
        client.close()


def _link_up(replica: int, master: int) -> bool:
    """Whether the server on ``replica`` replicates ``master`` with its link up."""
    info = _info(replica, "replication")
    return (
        info.get("role") == "slave"
        and int(info.get("master_port", 0)) == master
        and info.get("master_link_status") == "up"
    )


def _evalsha_calls(port: int) -> int:
    stats = _info(port, "commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)) if isinstance(stats, dict) else 0


def _role(port: int) -> tuple[str, Optional[int]]:
    """``ROLE`` of the server on ``port``: ("master", None) or ("slave", its master's port)."""
    client = redis.Redis(port=port, socket_timeout=1)
    try:
        reply = client.execute_command("ROLE")
    finally:
        client.close()
    role = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
    if role == "master":
        return role, None
    return role, int(reply[2])
