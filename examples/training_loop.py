"""A training loop that finds the batch that fits and backs off under memory pressure, with NumPy only.

The model is a two-layer network trained with SGD on synthetic data. ``fit_batch`` runs a step at the largest
batch that fits: it starts at ``--batch`` and halves on out-of-memory. NumPy raises ``MemoryError`` only when the
machine itself is out of memory, so to see the halving on any machine the step enforces an accelerator-sized
limit on its activations (``--device-mb``) and raises the same ``MemoryError`` a full GPU would (PyTorch's
``OutOfMemoryError`` is handled the same way). ``on_pressure`` watches the level in a background thread; at
``high`` the loop halves its batch before the next epoch instead of waiting for an out-of-memory error.

    python examples/training_loop.py --batch 1024 --device-mb 8

prints the out-of-memory at batch 1024 (16 MB of activations against 8 MB) and the epochs at batch 512.
"""

from __future__ import annotations

import argparse
import logging
import threading

import numpy as np

import apsi_memory as memory

MiB = 1 << 20


class Model:
    def __init__(self, features: int, hidden: int, rng: np.random.Generator) -> None:
        self.w1 = rng.normal(scale=features ** -0.5, size=(features, hidden))
        self.w2 = rng.normal(scale=hidden ** -0.5, size=(hidden, 1))

    def step(self, x: np.ndarray, y: np.ndarray, learning_rate: float) -> float:
        """One SGD step on (x, y); returns the batch's mean squared error."""
        h = np.maximum(x @ self.w1, 0.0)  # the activations: batch x hidden float64
        error = h @ self.w2 - y
        grad_h = (error @ self.w2.T) * (h > 0)
        self.w2 -= learning_rate * h.T @ error / len(x)
        self.w1 -= learning_rate * x.T @ grad_h / len(x)
        return float(np.mean(error ** 2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=1024, help="the batch to try first")
    parser.add_argument("--device-mb", type=float, default=8, help="memory the activations may take")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")  # fit_batch's halvings are WARNINGs

    rng = np.random.default_rng(0)
    x = memory.array([args.samples, args.features], "float64")  # RAM if it fits the budget, else the SSD
    x[:] = rng.normal(size=x.shape)
    y = np.sin(x[:, :1]) + 0.1 * x[:, 1:2]
    model = Model(args.features, args.hidden, rng)
    limit = args.device_mb * MiB

    tight = threading.Event()
    watcher = memory.on_pressure(lambda reading: tight.set(), level="high", every=0.5)

    def train_step(batch: int) -> float:
        need = batch * args.hidden * 8
        if need > limit:  # what a full GPU does; on the CPU NumPy raises MemoryError itself when RAM runs out
            raise MemoryError(f"out of memory: {batch} samples need {need / MiB:.0f} MB of activations, "
                              f"{limit / MiB:.0f} MB available")
        rate = 2.0 / args.hidden  # the output sums over hidden units: a step this size moves it by O(1)
        losses = [model.step(x[i:i + batch], y[i:i + batch], rate) for i in range(0, args.samples, batch)]
        return float(np.mean(losses))

    batch = args.batch
    try:
        for epoch in range(args.epochs):
            if tight.is_set() and batch > 1:
                batch //= 2  # memory is tight: back off before it runs out
                tight.clear()
            loss, batch = memory.fit_batch(train_step, batch)  # the next epoch starts at the batch that fitted
            print(f"epoch {epoch}: loss {loss:.4f} at batch {batch}")
    finally:
        watcher.stop()
        memory.free(x)


if __name__ == "__main__":
    main()
