"""Collective algorithms, one family per folder, each written against what its medium offers.

``sockets/`` — ring, tree, recursive doubling, direct and the hierarchy's pure pieces — is
written against ``Link`` (sockets/link.py: point-to-point frames between ranks); ``shm/`` is
written against the slot space of a group's shared memory (shm/space.py: rounds, not
messages). Both work on raw bytes (uint8 NumPy views of the caller's tensors) plus an item
size and a lowered reduction, never torch. chunking.py and select.py are pure (no I/O) and
unit-tested with tables; select.py's table gives the socket algorithm itself, not a name.
"""
