"""How a group's collectives move bytes: one transport strategy, chosen once per group.

``Transport`` (base.py) is the contract; ``open_transport`` (setup.py) chooses, at group creation and alike on
every rank (every decision goes through the group's store):

* ``ShmTransport`` (shm.py) when every rank shares this host and could map every segment:
  shared memory, composed with a SocketTransport for all_to_all;
* ``HierarchyTransport`` (hierarchy.py) when the group spans hosts and some host has two or
  more of its ranks: shared memory within each host, the socket algorithms between leaders;
* ``SocketTransport`` (sockets.py) otherwise: the socket algorithms over the group's mesh.

Transports are composed, never subclassed or patched: the backend calls
``type(transport).all_reduce`` and that is what runs. They see bytes (uint8 NumPy views),
CollectiveCalls and lowered reductions (a base-op reducer and an optional post step), never
torch tensors nor the user's ReduceOp.
"""

