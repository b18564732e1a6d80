"""Datasets over files other libraries write: HDF5 (``HDF5Dataset``),
Arrow IPC / Feather v2 / Parquet (``ArrowDataset``, and ``ArrowImages`` for a
column of encoded images), Zarr v2 / v3 (``ZarrDataset``) and LMDB
(``LMDBDataset``, read with liblmdb itself: no Python package).

The file format's own library (h5py, pyarrow, zarr) only parses the
metadata and opens the file (zarr also reads compressed chunks); rows that lie
in the file as plain fixed-width arrays are memory-mapped and gathered in C,
as ``ArrayDataset`` gathers them.  No library is imported until a dataset is
made, so ``import fastload`` works without them; ``pip install
"fastload-torch[formats]"`` installs them.
"""

from .arrow import ArrowDataset
from .arrow_images import ArrowImages
from .hdf5 import HDF5Dataset
from .lmdb import LMDBDataset
from .zarr import ZarrDataset

__all__ = ["ArrowDataset", "ArrowImages", "HDF5Dataset", "LMDBDataset", "ZarrDataset"]
