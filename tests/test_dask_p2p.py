"""p2p rechunks and shuffles on ``cluster()``'s workers: shards a worker has sent are not held after.

In a 1 GiB group a p2p rechunk of dask's 128 MiB chunks had each worker hold 256 MiB of shards it had already sent
(nothing to spill), pause, run through its line and be killed by its nanny 6 times, then hang to the time limit."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip("distributed", reason="apsi_memory.dask needs the dask extra: pip install 'apsi-memory[dask]'")

from apsi_memory import dask as amd
from apsi_memory import decide
from apsi_memory.dask.shards import release_sent_shards

pytestmark = pytest.mark.dask

SHARD_BYTES = 4 << 20  # over dask's 2 MiB message limit, as one shard of a 128 MiB chunk is (10.7 MiB)


async def sent_shards_still_held(senders: int = 3, shards: int = 3) -> int:
    """How many of ``shards`` arrays a p2p comm buffer of ``senders`` still holds once it has sent them all, under
    this process's ``dask.config`` (``distributed.p2p.comm.message-bytes-limit``), as a worker's does."""
    import dask
    from dask.utils import parse_bytes
    from distributed.shuffle._comms import CommShardsBuffer
    from distributed.shuffle._limiter import ResourceLimiter

    async def send(address: str, batch: list[Any]) -> dict[str, str]:
        await asyncio.sleep(0.05)  # on the wire: the next write finds this sender busy and goes to another
        return {"status": "OK"}

    buffer = CommShardsBuffer(send=send, memory_limiter=ResourceLimiter(1 << 30), concurrency_limit=senders,
                              max_message_size=parse_bytes(dask.config.get("distributed.p2p.comm.message-bytes-limit")))
    refs = []
    for i in range(shards):  # one write each, as each transfer task of a rechunk writes its input chunk's shards
        shard = np.ones(SHARD_BYTES // 8)
        refs.append(weakref.ref(shard))
        await buffer.write({"worker-b": (i, [((i,), ((0,), shard))])})
        del shard
    while buffer.bytes_memory:  # all sent; the buffer stays open, as it does till the transfer ends
        await asyncio.sleep(0.01)
    gc.collect()
    held = sum(ref() is not None for ref in refs)
    await buffer.close()
    return held


@pytest.fixture
def cluster_settings() -> Iterator[None]:
    """This process's dask.config as cluster() sets it for its workers."""
    import dask

    with dask.config.set(decide.dask_settings(384 << 20)):
        yield


def test_a_p2p_buffer_holds_no_shard_it_has_sent(cluster_settings: None) -> None:
    """Each of p2p's senders kept the last shards it sent until it had more to send: 3 of 3 here, 256 MiB a
    worker in the 1 GiB rechunk. With the library's release and settings, none."""
    release_sent_shards()
    assert asyncio.run(sent_shards_still_held()) == 0


def test_cluster_workers_hold_no_p2p_shard_they_have_sent() -> None:
    """The release reaches cluster()'s worker processes, with its settings."""
    with amd.cluster(n_workers=1, threads_per_worker=1, dashboard_address=":0") as made, made.get_client() as c:
        assert list(c.run(sent_shards_still_held).values()) == [0]  # run on the worker's event loop


def test_a_dask_without_p2p_buffers_still_sets_its_workers_up(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "distributed.shuffle._buffer", None)  # its import raises ImportError
    assert release_sent_shards() is False
