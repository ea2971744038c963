"""Seeing inside a running job: the flight recorder (recorder.py) that every rank keeps of
its last operations. It knows no tensors and imports no torch, so the launcher can read what
the ranks write; the layers that run operations (collectives, RPC) feed it."""
