"""The dask settings ``apsi_memory.dask`` reads: ``apsi-memory.max-pause``, and dask's own memory lines
``distributed.worker.memory.*`` as the user set them, turned into the lines ``PressurePlugin`` and the chunk size
follow (``decide.workers.worker_lines``); each one not followed is a WARNING, once per process. And those it makes
(``follow_limit``: chunk size, p2p buffers, rechunk method), set back when their cluster closes (``restore``)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import dask

from ..decide import DASK_PAUSE_FRACTION, MAX_PAUSE_S, Level, dask_settings
from ..decide.workers import MEMORY_SETTINGS, WorkerLines, worker_lines
from ..errors import ArgumentError
from ..units import fmt_size

MAX_PAUSE_SETTING = "apsi-memory.max-pause"
CHUNK_SETTING = "array.chunk-size"
MEMORY_PREFIX = "distributed.worker.memory."
P2P_PREFIX = "distributed.p2p."
logger = logging.getLogger("distributed.apsi_memory")  # as in __init__: dask's logging setup shows it
_warned: set[str] = set()  # the notes this process has logged: each once, not once per worker or per scale


def max_pause_s(given: float | None = None) -> float:
    """Seconds a worker stays paused at most: ``given``, else the dask setting ``apsi-memory.max-pause`` (seconds,
    or a duration such as ``"2 minutes"``), else ``decide.MAX_PAUSE_S``; ``float("inf")``: no bound."""
    from dask.utils import parse_timedelta

    value = given if given is not None else dask.config.get(MAX_PAUSE_SETTING, default=None)
    try:
        seconds = MAX_PAUSE_S if value is None else float(value) if isinstance(value, (int, float)) \
            else float(parse_timedelta(value, default="s"))
    except (TypeError, ValueError, KeyError):
        seconds = -1.0
    if not seconds >= 0:  # NaN too
        raise ArgumentError(f"max pause {value!r} ({MAX_PAUSE_SETTING}): seconds a worker may stay paused, a number "
                            "of at least 0, a duration such as '2 minutes', or float('inf') for no bound")
    return seconds


def dask_defaults() -> dict[str, Any]:
    """dask's own defaults, as its packages ship them: what ``set_by_user`` compares against."""
    merged: dict[str, Any] = dask.config.merge(*dask.config.defaults)
    return merged


def set_by_user(key: str, defaults: dict[str, Any], given: dict[str, Any]) -> bool:
    """``key`` is set here to other than dask's default (``dask.config.set``, a YAML file, a ``DASK_*`` variable),
    or given in a ``DASK_*`` variable or a YAML file of dask's config paths even where equal to the default:
    ``DASK_ARRAY__CHUNK_SIZE=128MiB`` is the user's word, and was overridden as if dask's default. ``defaults``
    and ``given`` are ``dask_defaults()`` and ``given_outside()``, read once by a caller asking of several keys."""
    current = dask.config.get(key, default=None)
    if current is None:
        return False
    return current != dask.config.get(key, default=None, config=defaults) or \
        dask.config.get(key, default=None, config=given) is not None


def given_outside() -> dict[str, Any]:
    """The settings of dask's YAML files (its config paths) and ``DASK_*`` variables, as they are now."""
    merged: dict[str, Any] = dask.config.merge(*dask.config.collect_yaml(dask.config.paths), dask.config.collect_env())
    return merged


def note_kept_chunk(advised: int, limit: int) -> None:
    """A WARNING, once per value, where the user's ``array.chunk-size`` (kept) is more than the chunk that fits a
    worker of ``limit`` bytes (``advised``)."""
    from dask.utils import format_bytes, parse_bytes

    value = dask.config.get(CHUNK_SETTING, default=None)
    try:
        size = int(parse_bytes(value))
    except (TypeError, ValueError, KeyError):
        return  # "auto" or unreadable: dask says so itself
    note = (f"dask setting {CHUNK_SETTING}={value!r} kept (yours), but a {format_bytes(limit)} worker fits chunks of "
            f"{format_bytes(advised)}: arrays chunked at {format_bytes(size)} may pause or kill its workers")
    if size > advised and note not in _warned:
        _warned.add(note)
        logger.warning("apsi_memory: %s", note)


def user_memory_settings() -> dict[str, float | bool]:
    """The ``distributed.worker.memory`` lines set by the user (``set_by_user``), by their last word:
    ``{"pause": 0.7}``."""
    defaults, given = dask_defaults(), given_outside()
    return {key: dask.config.get(MEMORY_PREFIX + key) for key in MEMORY_SETTINGS
            if set_by_user(MEMORY_PREFIX + key, defaults, given)}


def memory_lines(pause: float = DASK_PAUSE_FRACTION, level: Level = Level.HIGH) -> WorkerLines:
    """``worker_lines`` of this process's settings, for a plugin pausing at ``pause`` and ``level``; each note
    logged as a WARNING the first time this process meets it."""
    lines = worker_lines(user_memory_settings(), pause, level)
    for note in lines.notes:
        if note not in _warned:
            _warned.add(note)
            logger.warning("apsi_memory: %s", note)
    return lines


def follow_limit(limit: int, nthreads: int) -> dict[str, int | str]:
    """Set (in this process's ``dask.config``, which nannies hand to the workers they start) and return
    ``decide.dask_settings`` for ``limit``, less the keys the caller set to other than dask's defaults (by
    ``dask.config.set``, a YAML file or a ``DASK_*`` variable): theirs win."""
    advised, settings = _advised(limit, nthreads)
    if CHUNK_SETTING not in settings:
        note_kept_chunk(int(advised[CHUNK_SETTING]), limit)
    dask.config.set(settings)
    _settings_made.update(settings)
    logger.info("apsi_memory: dask settings for a %s worker: %s", fmt_size(limit), settings)
    return settings


def worker_side(limit: int, nthreads: int) -> dict[str, int | str]:
    """``follow_limit``'s settings that a worker reads itself (p2p's buffers and message limit), for a nanny whose
    workers take its own config: the preload's (the chunk size and rechunk method are the client's)."""
    return {key: value for key, value in _advised(limit, nthreads)[1].items() if key.startswith(P2P_PREFIX)}


def _advised(limit: int, nthreads: int) -> tuple[dict[str, int | str], dict[str, int | str]]:
    """``decide.dask_settings`` for ``limit``, and those of them ours to set."""
    defaults, given = dask_defaults(), given_outside()
    advised = dask_settings(limit, nthreads, memory_lines())
    return advised, {key: value for key, value in advised.items() if _ours_to_set(key, defaults, given)}


def _ours_to_set(key: str, defaults: dict[str, Any], given: dict[str, Any]) -> bool:
    return not set_by_user(key, defaults, given) or dask.config.get(key, default=None) == _settings_made.get(key)


_settings_made: dict[str, Any] = {}  # what follow_limit set last: a later cluster or scale may change it again


def settings_now(keys: Iterable[str]) -> dict[str, tuple[Any, bool]]:
    """Each key's value in ``dask.config``, and whether ``follow_limit`` set it (for a cluster still open)."""
    values = {key: dask.config.get(key, default=None) for key in keys}
    return {key: (value, key in _settings_made and value == _settings_made[key]) for key, value in values.items()}


def restore(before: dict[str, tuple[Any, bool]]) -> None:
    """``dask.config`` as it was before a cluster: the settings ``follow_limit`` made are the cluster's, not the
    process's. A key someone else changed since (the user, another cluster) stays as they left it; one an open
    cluster had set is that cluster's again."""
    restored = {key: value for key, (value, _) in before.items()
                if key in _settings_made and dask.config.get(key, default=None) == _settings_made[key]}
    dask.config.set(restored)
    for key, value in restored.items():
        if before[key][1]:
            _settings_made[key] = value
        else:
            del _settings_made[key]
