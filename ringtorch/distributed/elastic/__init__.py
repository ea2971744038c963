"""``torch.distributed.elastic``'s place in ringtorch: only what workers import from it.

Workers written for torchrun decorate their entry point with
``torch.distributed.elastic.multiprocessing.errors.record``; the same import path works
under ``ringtorch.distributed``. The agent itself lives in ``ringtorch.launcher``.
"""
