"""A challenge network that each GPU worker loads itself (``run_challenge(load_on_workers=True)``):
read or generated there, checked, packed and held by a task pinned to the worker; only a summary
reaches the client, which checks that every worker loaded the same network."""

from __future__ import annotations

import hashlib
import os

import numpy as np
from distributed import Client, Future

from dasknn.challenge.network_checks import check_network
from dasknn.datasets import load_network, parse_radixnet_spec
from dasknn.inference import HeldNetwork, submit_pinned
from dasknn.kernels.cuda_inference import CompactLayers, compact_layers, weight_bytes
from dasknn.kernels.inference import pack_layers
from dasknn.runtime.step_timeout import step_timeout_error
from dasknn.runtime.waiting import gather_at_most, wait_at_most

__all__ = [
    "DIGEST_SAMPLE",
    "describe_compact",
    "load_compact_network",
    "load_on_gpu_workers",
    "worker_network_spec",
]

#: Entries of the indices (and of the weights, when one per nonzero) that the digest reads, evenly
#: spaced; the offsets and the per-layer weights are read whole.
DIGEST_SAMPLE = 1 << 20


def worker_network_spec(network) -> str:
    """The network as the workers load it: a checked ``radixnet:N:L[:SEED]`` spec, or an
    absolute path (the workers see it at the same path).

    Raises
    ------
    ValueError
        If ``network`` is neither a path nor a string, or a spec that does not parse.
    """
    if not isinstance(network, str | os.PathLike):
        raise ValueError(
            "load_on_workers=True needs the network as a directory or a radixnet:N:L spec that "
            f"each GPU worker loads itself, not a {type(network).__name__} of matrices"
        )
    text = os.fspath(network)
    if text.startswith("radixnet:"):
        parse_radixnet_spec(text)
        return text
    return os.path.abspath(text)


def load_compact_network(
    spec: str, neurons: int | None, layers: int | None, seed: int, dtype: str, tiled: bool
) -> CompactLayers:
    """On a worker: load the network of ``spec`` (:func:`dasknn.datasets.load_network`, in
    ``dtype``), check it (:func:`dasknn.challenge.network_checks.check_network`) and return its
    compact form (:func:`dasknn.kernels.cuda_inference.compact_layers`)."""
    dtype = np.dtype(dtype)
    matrices = load_network(spec, neurons=neurons, layers=layers, seed=seed, dtype=dtype)
    check_network(matrices, dtype, tiled)
    return compact_layers(pack_layers(matrices, dtype, groups=False))


def describe_compact(network: CompactLayers, tiled: bool) -> dict:
    """On a worker: neurons, layers, edges, device bytes (:func:`weight_bytes`) and a blake2b
    digest (offsets, per-layer weights, :data:`DIGEST_SAMPLE` indices and weights)."""
    device_bytes, largest_layer = weight_bytes(network, tiled=tiled)
    digest = hashlib.blake2b(digest_size=16)
    stride = max(1, network.indices.size // DIGEST_SAMPLE)
    values = network.values if network.per_layer else network.values[::stride]
    for part in (network.indptr, network.indices[::stride], values):
        digest.update(str(part.dtype).encode())
        digest.update(np.ascontiguousarray(part).tobytes())
    return {
        "neurons": network.neurons,
        "layers": network.n_layers,
        "edges": int(network.indptr[-1, -1]) if network.n_layers else 0,
        "device_bytes": int(device_bytes),
        "largest_layer": int(largest_layer),
        "digest": digest.hexdigest(),
    }


def load_on_gpu_workers(
    client: Client,
    addresses: list[str],
    spec: str,
    *,
    neurons: int | None,
    layers: int | None,
    seed: int,
    dtype: np.dtype,
    tiled: bool,
    step_timeout: float,
) -> HeldNetwork:
    """Have each worker of ``addresses`` load the network of ``spec`` and hold its compact copy.

    Parameters
    ----------
    client : distributed.Client
    addresses : list of str
        The GPU workers.
    spec : str
        From :func:`worker_network_spec`.
    neurons, layers, seed : int or None
        Passed to :func:`dasknn.datasets.load_network`.
    dtype : numpy dtype
        The kernel's arithmetic.
    tiled : bool
        Whether the run uses the tiled CUDA mode (its checks and device bytes).
    step_timeout : float
        Seconds the loads may take, all together.

    Returns
    -------
    HeldNetwork
        The copies, pinned to their workers, and the network's summary; the caller releases it.

    Raises
    ------
    StepTimeoutError
        If a worker did not finish its load within ``step_timeout``, naming it.
    ValueError, OSError, MemoryError, RuntimeError
        A worker's load failed, or the workers loaded different networks (naming the worker).

    Every copy is released when it raises.
    """
    copies: dict[str, Future] = {}
    summaries: dict[str, Future] = {}
    try:
        for address in addresses:
            copies[address] = submit_pinned(
                client, address, load_compact_network, spec, neurons, layers, seed, dtype.name,
                tiled,
            )  # fmt: skip
            summaries[address] = submit_pinned(
                client, address, describe_compact, copies[address], tiled
            )
        reports = _reports(client, summaries, spec, step_timeout)
        summary = _same_network(reports, spec)
    except BaseException:
        for future in [*summaries.values(), *copies.values()]:  # the traceback holds them
            future.release()
        raise
    for future in summaries.values():
        future.release()
    return HeldNetwork(copies=copies, **summary)


def _reports(
    client: Client, summaries: dict[str, Future], spec: str, step_timeout: float
) -> dict[str, dict]:
    """Every worker's summary once all loads finished within ``step_timeout``; else the first
    failed load's error, naming its worker."""
    if not wait_at_most(list(summaries.values()), step_timeout):
        running = [address for address, future in summaries.items() if not future.done()]
        raise step_timeout_error(
            client, f"the workers did not finish loading the network {spec!r}", step_timeout,
            running, dict.fromkeys(running, "loading the network"),
        )  # fmt: skip
    for address, future in sorted(summaries.items()):
        if future.status == "error":
            raise _naming_worker(future.exception(timeout=step_timeout), address, spec)
    try:
        values = gather_at_most(client, list(summaries.values()), step_timeout)
    except TimeoutError:
        raise step_timeout_error(
            client, "the workers' summaries of the network did not arrive", step_timeout,
            list(summaries),
        ) from None  # fmt: skip
    return dict(zip(summaries, values, strict=True))


def _naming_worker(error: BaseException, address: str, spec: str) -> BaseException:
    """A worker's load error naming the worker and network, of the same type (else
    ``RuntimeError``)."""
    message = f"worker {address} could not load the network {spec!r}: {error}"
    try:
        named = type(error)(message)
    except Exception:  # noqa: BLE001 - a type that needs other arguments
        named = RuntimeError(message)
    named.__cause__ = error
    return named


def _same_network(reports: dict[str, dict], spec: str) -> dict:
    """The summary that every worker reported (without the digest), or ``ValueError`` naming
    two workers that loaded different networks."""
    first = min(reports)
    for address, report in sorted(reports.items()):
        if report != reports[first]:
            raise ValueError(
                f"the workers loaded different networks from {spec!r}: "
                f"{_described(first, reports[first])}, {_described(address, report)} (every "
                "worker must read the same files)"
            )
    return {key: value for key, value in reports[first].items() if key != "digest"}


def _described(address: str, report: dict) -> str:
    return (
        f"worker {address} has {report['neurons']} neurons, {report['layers']} layers, "
        f"{report['edges']} edges (digest {report['digest']})"
    )
