"""torch.distributed's key-value stores: TCPStore, FileStore, HashStore and PrefixStore.

Every store speaks the Store API of ``base.Store``; values are bytes (str values are encoded)
and nothing a store receives is ever unpickled. ``python -m ringtorch.store --port P`` runs a
standalone TCPStore server for multi-node jobs.
"""

from ringtorch.store.base import Store
from ringtorch.store.file import FileStore
from ringtorch.store.hash import HashStore
from ringtorch.store.prefix import PrefixStore
from ringtorch.store.tcp import StoreAddressInUseError, TCPStore

__all__ = ["FileStore", "HashStore", "PrefixStore", "Store", "StoreAddressInUseError",
           "TCPStore"]
