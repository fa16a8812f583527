"""Waymo Open Dataset message classes for the WOMD adapter: the unmodified ``.proto`` files of
waymo-open-dataset (Apache-2.0, see README.md here) and the Python modules protoc generated from them
(``regenerate.py`` rebuilds these).

The generated modules register their descriptors in :data:`POOL`, not in protobuf's default pool: the
official ``waymo_open_dataset`` package registers the same file and message names there, and two
differing versions of one file in one pool refuse to load. With a pool of its own the adapter imports
next to any version of that package.
"""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
