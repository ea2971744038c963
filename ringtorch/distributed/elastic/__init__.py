"""``torch.distributed.elastic``'s place in ringtorch: what programs import from it.

``multiprocessing.errors`` (``record``, ``ChildFailedError``) for workers and launching
programs, ``multiprocessing`` (log specs, ``SignalException``) for ``elastic_launch``'s
config, ``rendezvous`` (the handler API and registry of custom rendezvous backends) and
``utils`` (store barriers, a logger, free ports). The agent itself is ``ringtorch.launcher``;
nothing here imports torch.
"""
