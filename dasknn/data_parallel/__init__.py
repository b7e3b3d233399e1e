"""Data-parallel execution on Dask: every worker holds the whole model (or a window of its
layers) and the rows of the data are cut into batches that the workers pull.

:mod:`~dasknn.data_parallel.driver` runs the batches with a per-device step
(:mod:`~dasknn.data_parallel.cpu_inference`, :mod:`~dasknn.data_parallel.gpu_inference`);
:mod:`~dasknn.data_parallel.inference` puts them together for sparse inference.
"""
