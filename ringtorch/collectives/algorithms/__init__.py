"""Collective algorithms, written once against the small point-to-point interface of link.py.

Every algorithm works on raw bytes (uint8 NumPy views of the caller's tensors) plus an item
size, so it never touches torch and runs unchanged over sockets today and shared memory later.
chunking.py and select.py are pure (no I/O) and unit-tested with tables.
"""
