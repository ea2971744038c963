"""The shared-memory algorithms: written against the slot space (space.py) of one host's
shared memory; every rank copies into its slot, enters a round, reads its peers' slots."""
