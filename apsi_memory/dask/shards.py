"""p2p's buffers let go of each batch of shards once it is sent or written (``release_sent_shards``).

Each of a p2p buffer's senders (``distributed.shuffle._buffer.ShardsBuffer``, 10 for the comm buffer) loops: take
a batch, send it (or write it to disk), wait for the next; while it waits its loop still refers to the batch it
took, and to the last shard it took when it filled the batch up to ``distributed.p2p.comm.message-bytes-limit``.
A shard over that limit (10.7 MiB of a 128 MiB chunk) goes whole, so in a 1 GiB group each worker of a p2p rechunk
held 256 MiB of shards already sent, outside its spillable data: it paused at 88 % of its limit with nothing to
spill, ran through its line after the grace, and its nanny killed it 6 times. The release empties the batch once
sent; ``decide.P2P_MESSAGE_BYTES`` (no message limit, set by ``cluster()``) leaves the batch as its only reference.

May import: decide, system, adapters, machinery, arrays, blocks.
"""

from __future__ import annotations

import functools
from typing import Any

RELEASES = "_apsi_memory_releases"  # marks the wrapped method: the release is made once per process


def release_sent_shards() -> bool:
    """Make every p2p buffer of this process empty each batch once its ``process`` (send or write) returns; True
    where done now, False where done before (a worker process gets it from each plugin set up in it) or where this
    dask has no such buffer (a private module: a later dask may move it, and its workers must still start)."""
    try:
        from distributed.shuffle._buffer import ShardsBuffer
    except ImportError:
        return False

    process = ShardsBuffer.process
    if getattr(process, RELEASES, False):
        return False

    @functools.wraps(process)
    async def releasing(self: Any, id: str, shards: list[Any], size: int) -> None:
        try:
            await process(self, id, shards, size)
        finally:
            shards.clear()  # the sender's own list, taken from the buffer: what it sent or wrote is elsewhere now

    setattr(releasing, RELEASES, True)
    ShardsBuffer.process = releasing
    return True
