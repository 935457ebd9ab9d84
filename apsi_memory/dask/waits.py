"""How ``map(engine=client)`` waits on a cluster: for a worker, and for its tasks while looking that a worker is
left to run them. A cluster with none for ``apsi-memory.no-worker-timeout`` seconds is an error, not a hang."""

from __future__ import annotations

from typing import Any

from ..errors import ArgumentError, BlockError

# How long map waits for a worker when the cluster has none (lost them, or never had any), unless the dask
# setting says otherwise; and how often a wait for blocks looks whether the cluster still has one.
NO_WORKER_TIMEOUT_S = 30.0
NO_WORKER_SETTING = "apsi-memory.no-worker-timeout"
WORKER_CHECK_S = 1.0


class Workers:
    """The cluster's workers, looked at while ``map`` waits: none for ``timeout`` seconds is an error, not a hang
    (tasks wait in the scheduler for a worker that never comes)."""

    def __init__(self, client: Any) -> None:
        self.client, self.timeout = client, no_worker_timeout()

    def ready(self, when: str) -> None:
        """At least one worker now, or within ``timeout`` seconds; else ``BlockError``."""
        from distributed import TimeoutError as DaskTimeoutError

        if self.client.nthreads():
            return
        try:
            self.client.wait_for_workers(1, timeout=self.timeout)
        except (TimeoutError, DaskTimeoutError) as exc:
            raise BlockError(f"map(engine=client): no dask worker for {self.timeout:g} s {when}: the cluster has "
                             "lost its workers (or never had any); start or scale up workers, or wait longer with "
                             f"the dask setting {NO_WORKER_SETTING}") from exc

    def wait(self, futures: list[Any], when: str, waiting: str) -> None:
        """Until ``futures`` are done (``when``: as ``distributed.wait``), looking every ``WORKER_CHECK_S`` seconds
        whether a worker is left to run them."""
        from distributed import TimeoutError as DaskTimeoutError
        from distributed import wait

        while True:
            try:
                wait(futures, timeout=WORKER_CHECK_S, return_when=when)
                return
            except (TimeoutError, DaskTimeoutError):
                self.ready(f"while {waiting} waited")


def no_worker_timeout() -> float:
    """Seconds ``map`` waits for a worker: the dask setting ``apsi-memory.no-worker-timeout`` (a number of
    seconds or a duration such as ``"2 minutes"``), else ``NO_WORKER_TIMEOUT_S``."""
    import dask
    from dask.utils import parse_timedelta

    value = dask.config.get(NO_WORKER_SETTING, default=None)
    try:
        seconds = NO_WORKER_TIMEOUT_S if value is None else float(parse_timedelta(value, default="s"))
    except (TypeError, ValueError, KeyError):
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise ArgumentError(f"dask setting {NO_WORKER_SETTING}={value!r}: seconds to wait for a worker, a number "
                            "of at least 0 or a duration such as '2 minutes'")
    return seconds
