"""django-redis on Redis Cluster: a connection factory and a client class.

django-redis 7 has no cluster support: its factories build one `redis.Redis` per URL, which on a
cluster answers MOVED for two slots in three. `ClusterConnectionFactory` builds one
`redis.cluster.RedisCluster` per set of startup nodes instead (it learns the slot map and
follows failovers itself); `ClusterClient` is django-redis's DefaultClient with the one
multi-key read the cache API needs split per slot (`get_many`: MGET of keys in several slots is
refused on a cluster). The lock keeps each lock's keys in one slot ({name} hash tags), so its
scripts run unchanged; see locks/redis_urls.py for the settings that select these.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from django_redis.client import DefaultClient
from django_redis.exceptions import ConnectionInterrupted
from django_redis.pool import ConnectionFactory
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisError
from redis.retry import Retry

# A command to a dead master fails fast, and is tried once more after the client re-reads the
# slot map (a MOVED after a failover, or the new master): not redis-py's default of 10 tries with
# exponential backoff, which hangs a caller ~7 s per call while a node is down.
CLUSTER_RETRIES = 2


class ClusterConnectionFactory(ConnectionFactory):  # type: ignore[misc]  # django-redis ships no types
    """OPTIONS: CLUSTER_NODES [(host, port), ...] (LOCATION names the first one, for django-redis),
    SOCKET_TIMEOUT, SOCKET_CONNECT_TIMEOUT, PASSWORD, USERNAME, CONNECTION_POOL_KWARGS (per node)."""

    # One RedisCluster per node list in the process, shared by every cache object (as
    # django-redis shares its pools): it holds a pool per node and the slot map.
    _clusters: dict[tuple[str, tuple[tuple[Any, ...], ...]], RedisCluster] = {}  # (url, nodes)
    _guard = threading.Lock()

    def connect(self, url: str) -> RedisCluster:
        nodes = tuple(tuple(n) for n in self.options.get("CLUSTER_NODES") or ())
        key = (url, nodes)
        with self._guard:
            client = self._clusters.get(key)
            if client is None:
                client = self._clusters[key] = RedisCluster(
                    startup_nodes=[ClusterNode(host, int(port)) for host, port in nodes],
                    retry=Retry(NoBackoff(), CLUSTER_RETRIES),
                    **self._node_kwargs(),
                )
        return client

    def _node_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        for option, arg in (("SOCKET_TIMEOUT", "socket_timeout"), ("SOCKET_CONNECT_TIMEOUT", "socket_connect_timeout"),
                            ("PASSWORD", "password"), ("USERNAME", "username")):
            if self.options.get(option):
                kwargs[arg] = self.options[option]
        pool = dict(self.options.get("CONNECTION_POOL_KWARGS", {}))
        pool.pop("retry", None)  # per-node retries are the cluster client's business (RedisCluster refuses it)
        kwargs.update(pool)
        return kwargs

    def disconnect(self, connection: RedisCluster) -> None:
        connection.disconnect_connection_pools()


class ClusterClient(DefaultClient):  # type: ignore[misc]  # django-redis ships no types
    """DefaultClient on a RedisCluster: `get_many` reads per slot (MGET may not span slots)."""

    def get_many(self, keys: Iterable[Any], version: int | None = None,
                 client: RedisCluster | None = None) -> dict[Any, Any]:
        if client is None:
            client = self.get_client(write=False)
        if not keys:
            return {}
        by_key = {self.make_key(k, version=version): k for k in keys}
        try:
            values = client.mget_nonatomic(list(by_key))
        except (RedisError, OSError) as exc:
            raise ConnectionInterrupted(connection=client) from exc
        return {by_key[k]: self.decode(v) for k, v in zip(by_key, values, strict=True) if v is not None}
