"""dasknn: distributed training and inference of sparse deep neural networks on Dask."""

from dasknn import datasets

__version__ = "0.1.0"

__all__ = ["datasets", "__version__"]
