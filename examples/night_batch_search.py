"""Find the batch that fits: one forward and backward step of a NumPy MLP under ``memory.fit_batch``, which
halves the batch on out-of-memory until the step fits, then trains at that batch.

    python examples/night_batch_search.py --batch 8192 --memory-mb 160

In a memory cgroup (``docker run -m``) the kernel OOM-kills a step that does not fit instead of failing an
allocation, so ``fit_batch`` caps the address space while the step runs (``RLIMIT_AS`` at what the process maps
plus what its group has free, less a margin): the allocation that would be killed raises ``MemoryError`` and the
batch is halved. ``--memory-mb`` gives the step that much room on any machine, as a container with that much free
would (a cap of the same kind, set here; ``fit_batch`` keeps a user's own lower cap as it is). Without it the room
is what ``memory.limits()`` says is free, and on a roomy machine the first batch fits at once. ``--plain`` is the
control, the steps at ``--batch`` without ``fit_batch``: in a container they do not fit, the kernel kills the job.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import resource
import time
from collections.abc import Iterator

import numpy as np

import apsi_memory as memory

MiB = 1 << 20


class Mlp:
    def __init__(self, features: int, hidden: int, rng: np.random.Generator) -> None:
        self.w1 = rng.normal(scale=features ** -0.5, size=(features, hidden)).astype(np.float32)
        self.w2 = rng.normal(scale=hidden ** -0.5, size=(hidden, 1)).astype(np.float32)

    def step(self, x: np.ndarray, y: np.ndarray, learning_rate: float) -> float:
        """Forward, backward, SGD update; the batch's mean squared error. Activations: batch x hidden float32,
        four of them at the peak (pre-activation, activation, its gradient, the mask)."""
        pre = x @ self.w1
        h = np.maximum(pre, 0)
        error = h @ self.w2 - y
        grad_h = (error @ self.w2.T) * (pre > 0)
        self.w2 -= learning_rate * (h.T @ error) / len(x)
        self.w1 -= learning_rate * (x.T @ grad_h) / len(x)
        return float(np.mean(error ** 2))


def vm_size() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))


@contextlib.contextmanager
def room(megabytes: float | None) -> Iterator[None]:
    """While the block runs, new mappings beyond ``megabytes`` more than now fail, as in a container with that
    much free under ``fit_batch``'s own cap."""
    if megabytes is None:
        yield
        return
    saved = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vm_size() + int(megabytes * MiB), saved[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, saved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8192, help="the batch to try first")
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=20, help="training steps at the batch that fitted")
    parser.add_argument("--memory-mb", type=float, help="room for the step (default: what is free)")
    parser.add_argument("--plain", action="store_true", help="the control: the steps at --batch, no fit_batch")
    args = parser.parse_args()
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")  # fit_batch's halvings are WARNINGs

    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.batch, args.features)).astype(np.float32)
    y = (np.sin(x[:, :1]) + 0.1 * x[:, 1:2]).astype(np.float32)
    model = Mlp(args.features, args.hidden, rng)
    rate = 2.0 / args.hidden  # the output sums over hidden units: a step this size moves it by O(1)

    def step(batch: int) -> float:
        return model.step(x[:batch], y[:batch], rate)

    started = time.perf_counter()
    with room(args.memory_mb):
        first, batch = (step(args.batch), args.batch) if args.plain else memory.fit_batch(step, args.batch)
        losses = [first] + [step(batch) for _ in range(args.steps - 1)]
    peak = 4 * batch * args.hidden * 4
    print(f"batch {batch:,} fitted (first tried {args.batch:,}; about {memory.fmt_size(peak)} of activations a step), "
          f"{args.steps} steps in {time.perf_counter() - started:.1f} s")
    print(f"loss {losses[0]:.4f} after the first step, {losses[-1]:.4f} after the last")


if __name__ == "__main__":
    main()
