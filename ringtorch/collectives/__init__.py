"""ProcessGroup, Work, reduction ops and the backends that move bytes; no global state."""
