"""dasknn: distributed training and inference of sparse deep neural networks on Dask."""

from dasknn import datasets
from dasknn.model import SparseMLP

__version__ = "0.1.0"

__all__ = ["SparseMLP", "datasets", "__version__"]
