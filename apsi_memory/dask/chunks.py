"""Chunk advice that reaches the arrays made before ``cluster()``: the chunk size it sets reaches only the arrays
made after it, and an array chunked before (or by hand at dask's default 128 MiB) still paused or killed workers
where stock dask finished (issue 30 item 3). Each graph sent to a ``cluster()``'s client is read for dask arrays
whose chunks are larger than its workers fit, and each is named once in a WARNING."""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from ..units import fmt_size

logger = logging.getLogger("distributed.apsi_memory")  # as in __init__: dask's logging setup shows it
ARRAY_TYPE = "dask.array.core.Array"  # what dask writes in an array layer's collection_annotations
WATCHED = "_apsi_memory_watched"  # marks the wrapper, so that it is put in place once


class BigChunks(NamedTuple):
    name: str  # the array's dask name, its graph layer
    shape: tuple[int, ...]
    chunk_bytes: int  # its largest chunk


def big_chunks(graph: Any, fits: int) -> list[BigChunks]:
    """The dask arrays of a graph sent to a scheduler (an expression, or a ``HighLevelGraph`` before dask 2025.1)
    whose largest chunk is over ``fits`` bytes, less those computed straight from one of them: their chunks follow
    its, and it is the one to rechunk."""
    found = []
    for hlg in _graphs(graph):
        over = {name: size for name, layer in hlg.layers.items() if (size := _chunk_bytes(layer)) > fits}
        found += [BigChunks(name, tuple(hlg.layers[name].collection_annotations["shape"]), size)
                  for name, size in over.items() if not over.keys() & hlg.dependencies.get(name, set())]
    return found


def largest_chunk(graph: Any) -> int:
    """The largest chunk of the dask arrays of a graph sent to a scheduler, those fused into others' tasks too
    (0: no array)."""
    return max((_chunk_bytes(layer) for hlg in _graphs(graph) for layer in hlg.layers.values()), default=0)


def _graphs(graph: Any) -> Iterator[Any]:
    from dask.highlevelgraph import HighLevelGraph

    if isinstance(graph, HighLevelGraph):
        yield graph
        return
    try:
        from dask._expr import HLGExpr
    except ImportError:  # pragma: no cover - dask before 2025.1 sends HighLevelGraphs
        return
    for node in graph.walk():  # arrays (not array-expr ones) sit in HLGExpr nodes, with their annotations
        if isinstance(node, HLGExpr) and isinstance(node.dsk, HighLevelGraph):
            yield node.dsk


def _chunk_bytes(layer: Any) -> int:
    """The largest chunk of the array a graph layer makes, from what dask notes on it (0: not an array)."""
    notes = getattr(layer, "collection_annotations", None) or {}
    if notes.get("type") != ARRAY_TYPE:
        return 0
    size = math.prod(notes.get("chunksize") or ()) * getattr(notes.get("dtype"), "itemsize", 0)
    return int(size) if math.isfinite(size) else 0  # unknown chunks (NaN): nothing to say


def name_big_chunks(graph: Any, fits: int, limit: int, named: set[str]) -> None:
    """A WARNING for each array of ``graph`` with chunks over ``fits`` (workers of ``limit`` bytes), unless
    ``named`` holds it already; it then does."""
    for big in big_chunks(graph, fits):
        if big.name in named:
            continue
        named.add(big.name)
        logger.warning("apsi_memory: dask array %s of shape %s has chunks of %s, more than this cluster's %s workers "
                       "fit: rechunk it to chunks of %s or less (or build it after cluster()), else it may pause or "
                       "kill them", big.name, big.shape, fmt_size(big.chunk_bytes), fmt_size(limit), fmt_size(fits))


def watch_submissions(check: Callable[[Any, Any], None]) -> None:
    """Call ``check(client, graph)`` before each graph a ``distributed.Client`` sends its scheduler (``compute``,
    ``persist``, ``get``: ``dask.compute`` and ``x.compute()`` too). distributed has no hook there (a scheduler
    plugin sees the keys, not the arrays' shapes), so this wraps ``Client._graph_to_futures``, once a process."""
    from distributed import Client

    send = getattr(Client, "_graph_to_futures", None)
    if send is None:  # a private method: a later distributed may rename it, and the advice is not worth a failure
        logger.info("apsi_memory: this distributed has no Client._graph_to_futures; arrays' chunks go unchecked")
        return
    if getattr(send, WATCHED, False):
        return

    @functools.wraps(send)
    def watched(client: Any, *args: Any, **kwargs: Any) -> Any:
        try:  # the graph comes first, or by name: expr (dsk before dask 2025.1)
            check(client, args[0] if args else kwargs.get("expr", kwargs.get("dsk")))
        except Exception:  # advice must never stop the work it is about
            logger.warning("apsi_memory: the chunk check failed; the work is sent as it is", exc_info=True)
        return send(client, *args, **kwargs)

    setattr(watched, WATCHED, True)
    Client._graph_to_futures = watched
