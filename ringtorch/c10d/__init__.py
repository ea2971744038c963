"""The backend door: torch.distributed's backend "ringtorch", run on ringtorch's engine.

Installing ringtorch registers the name through torch's backend autoload (``autoload.py``,
cheap: it imports nothing of the engine); ``init_process_group("ringtorch")`` then creates
a ``RingtorchGroup`` (``group.py``), a ``torch.distributed.ProcessGroup`` whose every
operation runs on a ``ringtorch.collectives.ProcessGroup`` that met its peers through torch's
own store (``torch_store.py``). This package imports nothing at import time.
"""
