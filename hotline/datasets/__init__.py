"""Dataset directories: Criteo preprocessing, the synthetic generator, and the on-disk format."""

from hotline.datasets.format import Batch, Dataset, DatasetError, DatasetWriter, Split

__all__ = ["Batch", "Dataset", "DatasetError", "DatasetWriter", "Split"]
