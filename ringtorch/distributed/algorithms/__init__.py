"""``ringtorch.distributed.algorithms``: torch.distributed.algorithms' training algorithms.

DDP communication hooks (``ddp_comm_hooks``) and model averaging (``model_averaging``), written
over the public names of ``ringtorch.distributed`` and ``ringtorch.futures`` only, so that they
run on any backend the facade offers. Importing this package imports none of its subpackages.
"""
