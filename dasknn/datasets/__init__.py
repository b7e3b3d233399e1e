"""Data sets: Graph Challenge files, MNIST, the RadiX-Net generator, extreme classification,
the standard-library text corpus."""

from dasknn.datasets.challenge_io import (
    challenge_bias,
    iter_challenge_network,
    layer_file,
    read_categories,
    read_challenge_network,
    read_sparse_tsv,
    write_categories,
    write_sparse_tsv,
)
from dasknn.datasets.extreme import SyntheticXMC, make_extreme_classification, oracle_top
from dasknn.datasets.mnist import (
    load_mnist_test,
    mnist_to_challenge_inputs,
    read_mnist_idx,
    resize_matrix,
)
from dasknn.datasets.network_spec import iter_network, load_network, parse_radixnet_spec
from dasknn.datasets.radixnet import iter_radixnet, radixnet, radixnet_group_size
from dasknn.datasets.stdlib_corpus import Corpus, load_stdlib_corpus
from dasknn.datasets.text import TextTask, stdlib_next_word
from dasknn.datasets.xmc import read_xmc

__all__ = [
    "Corpus",
    "SyntheticXMC",
    "TextTask",
    "load_stdlib_corpus",
    "make_extreme_classification",
    "oracle_top",
    "read_xmc",
    "stdlib_next_word",
    "challenge_bias",
    "layer_file",
    "load_mnist_test",
    "iter_challenge_network",
    "iter_network",
    "iter_radixnet",
    "load_network",
    "parse_radixnet_spec",
    "mnist_to_challenge_inputs",
    "radixnet",
    "radixnet_group_size",
    "read_categories",
    "read_challenge_network",
    "read_mnist_idx",
    "read_sparse_tsv",
    "resize_matrix",
    "write_categories",
    "write_sparse_tsv",
]
