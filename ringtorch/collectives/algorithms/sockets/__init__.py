"""The socket algorithms: written once against ``Link`` (link.py), run over any Link (the
group's mesh, a subset of it, a group of one)."""
