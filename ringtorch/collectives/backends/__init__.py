"""Backends: the objects that actually run collectives for one group (native, mpi)."""
