"""Datasets over files other libraries write: HDF5 (``HDF5Dataset``),
Arrow IPC / Feather v2 / Parquet (``ArrowDataset``) and LMDB
(``LMDBDataset``, read with liblmdb itself: no Python package).

The file format's own library (h5py, pyarrow) only parses the metadata and
opens the file; rows that lie in the file as plain fixed-width arrays are
memory-mapped and gathered in C, as ``ArrayDataset`` gathers them.  Neither
library is imported until a dataset is made, so ``import fastload`` works
without them; ``pip install fastload[formats]`` installs both.
"""

from .arrow import ArrowDataset
from .hdf5 import HDF5Dataset
from .lmdb import LMDBDataset

__all__ = ["ArrowDataset", "HDF5Dataset", "LMDBDataset"]
