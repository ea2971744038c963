"""``torch.distributed.elastic.multiprocessing``: here only its ``errors`` module."""
