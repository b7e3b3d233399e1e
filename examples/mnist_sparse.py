"""Train a sparse RadiX-Net-style network on MNIST, model-parallel on Dask workers or in-process.

The bundled MNIST test set (``dasknn.datasets.load_mnist_test``) is split into its first 8,000
images for training and its last 2,000 for evaluation. Images become 32 x 32 = 1024 input features:

- ``--inputs binary`` (default): the Graph Challenge rule, ``mnist_to_challenge_inputs`` (bilinear
  resize to 32 x 32, pixel = 1 where the grey level is above 0.5, else 0);
- ``--inputs grey``: the same bilinear resize, keeping the grey levels in [0, 1].

The network is ``SparseMLP.radixnet(neurons=1024, layers=L, n_outputs=10)``: ``L`` sparse
1024 x 1024 RadiX-Net layers (32 connections per neuron) with ReLU, then a fully connected
1024 -> 10 linear layer trained with softmax cross-entropy. Weights start uniform in
``[-sqrt(6 / fan_in), sqrt(6 / fan_in)]`` (He scaling of a uniform initialisation).

With ``--workers P`` (default 2) a ``distributed.LocalCluster`` of ``P`` single-threaded worker
processes is started, every layer is split by neurons with ``graph.partition_network(...,
method=--method)`` and the model is trained by
``DistributedSparseMLP(model, client, partition=partition)``; the measured communication is
printed at the end. ``--workers 0`` trains the same model in this process (``SparseMLP.fit``),
with the same steps.

Run ``python examples/mnist_sparse.py --help`` for the options; it prints the learning curve (mean
training loss and held-out accuracy after every epoch).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field

import numpy as np

from dasknn import DistributedSparseMLP, SparseMLP
from dasknn.datasets import load_mnist_test, mnist_to_challenge_inputs, resize_matrix

SIDE = 32
NEURONS = SIDE * SIDE
N_CLASSES = 10


@dataclass
class Result:
    """Learning curve of one run: per epoch the training loss, the accuracy and the elapsed time."""

    losses: list[float] = field(default_factory=list)
    accuracies: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    comm: str = ""


def mnist_inputs(images: np.ndarray, inputs: str) -> np.ndarray:
    """Images (n, 28, 28) uint8 -> (n, 1024) float features, binary or grey (see module doc)."""
    if inputs == "binary":
        return mnist_to_challenge_inputs(images, side=SIDE).toarray()
    if inputs == "grey":
        rows = resize_matrix(images.shape[1], SIDE)
        cols = resize_matrix(images.shape[2], SIDE)
        resized = np.einsum("ui,nij,vj->nuv", rows, images / 255.0, cols, optimize=True)
        return np.clip(resized, 0.0, 1.0).reshape(len(images), NEURONS)
    raise ValueError(f"inputs must be 'binary' or 'grey', got {inputs!r}")


def load_split(n_train: int, n_test: int, inputs: str):
    """First ``n_train`` images for training, last ``n_test`` for evaluation (disjoint)."""
    images, labels = load_mnist_test()
    if n_train < 1 or n_test < 1 or n_train + n_test > len(images):
        raise ValueError(
            f"need 1 <= train, 1 <= test and train + test <= {len(images)}, "
            f"got train={n_train}, test={n_test}"
        )
    features = mnist_inputs(images, inputs)
    labels = labels.astype(np.int64)
    return (
        features[:n_train],
        labels[:n_train],
        features[len(images) - n_test :],
        labels[len(images) - n_test :],
    )


def build_model(layers: int, seed: int, dtype) -> SparseMLP:
    """``layers`` sparse ReLU layers of 1024 neurons and a dense 1024 -> 10 softmax classifier."""
    return SparseMLP.radixnet(
        neurons=NEURONS,
        layers=layers,
        seed=seed,
        activation="relu",
        loss="softmax_cross_entropy",
        n_outputs=N_CLASSES,
        scale="he",
        dtype=dtype,
    )


def accuracy(trainer, X: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of samples whose most probable class is the label."""
    return trainer.score(X, labels)


def train(trainer, data, epochs: int, batch_size: int, lr: float, seed: int, progress: bool,
          log=print) -> Result:
    """Run ``epochs`` epochs of ``trainer.fit`` (a SparseMLP or a DistributedSparseMLP)."""
    x_train, y_train, x_test, y_test = data
    result = Result()
    start = time.perf_counter()
    log(f"{'epoch':>5} {'train loss':>10} {'test acc':>8} {'time s':>7}")
    for epoch in range(epochs):
        trainer.fit(x_train, y_train, batch_size=batch_size, epochs=1, lr=lr, seed=seed + epoch,
                    progress=progress)
        loss = trainer.loss_curve_[-1]
        result.losses.append(loss)
        result.accuracies.append(accuracy(trainer, x_test, y_test))
        result.seconds.append(time.perf_counter() - start)
        log(f"{epoch + 1:>5} {loss:>10.4f} {result.accuracies[-1]:>8.4f} "
            f"{result.seconds[-1]:>7.1f}")
    return result


def run(
    workers: int = 2,
    method: str = "hypergraph",
    layers: int = 3,
    epochs: int = 6,
    batch_size: int = 64,
    lr: float = 0.2,
    seed: int = 0,
    n_train: int = 8000,
    n_test: int = 2000,
    inputs: str = "binary",
    dtype=np.float32,
    progress: bool = True,
    log=print,
) -> Result:
    """Build, (distribute,) train and evaluate; returns the learning curve."""
    data = load_split(n_train, n_test, inputs)
    model = build_model(layers, seed, dtype)
    log(f"{model}\ntraining on {n_train} images, evaluating on {n_test} ({inputs} inputs)")
    if workers == 0:
        log("single process (SparseMLP)")
        return train(model, data, epochs, batch_size, lr, seed, progress, log)

    from distributed import Client

    from dasknn.runtime.cluster import local_cluster
    from graph import partition_network

    partition = partition_network(model.weights, workers, method=method, seed=seed)
    log(f"{workers} workers, {method} partition")
    with (
        local_cluster(workers) as cluster,
        Client(cluster) as client,
    ):
        with DistributedSparseMLP(model, client, partition=partition) as dist:
            result = train(dist, data, epochs, batch_size, lr, seed, progress, log)
            result.comm = dist.comm_report().format()
            log(result.comm)
    return result


def main(argv: list[str] | None = None) -> Result:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2,
                        help="Dask workers (parts); 0 trains in this process (default 2)")
    parser.add_argument("--method", default="hypergraph", choices=["hypergraph", "random", "block"])
    parser.add_argument("--layers", type=int, default=3, help="sparse 1024-neuron layers (3)")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train", type=int, default=8000, help="first images to train on")
    parser.add_argument("--test", type=int, default=2000, help="last images to evaluate on")
    parser.add_argument("--inputs", default="binary", choices=["binary", "grey"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    args = parser.parse_args(argv)
    result = run(
        workers=args.workers,
        method=args.method,
        layers=args.layers,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        n_train=args.train,
        n_test=args.test,
        inputs=args.inputs,
        dtype=np.dtype(args.dtype),
        progress=not args.no_progress,
    )
    print(f"final held-out accuracy: {result.accuracies[-1]:.4f}" if result.accuracies else "")
    return result


if __name__ == "__main__":
    main()
