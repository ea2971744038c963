"""ringtorch: torch.distributed rebuilt in Python; change the imports, keep the program.

Importing ``ringtorch`` starts nothing and imports nothing heavy: ``ringtorch.distributed``
and the other subpackages are imported on demand.
"""

__version__ = "0.1.0"
