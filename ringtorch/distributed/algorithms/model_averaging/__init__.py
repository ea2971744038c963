"""``ringtorch.distributed.algorithms.model_averaging``: averaging parameters, not gradients.

``averagers.PeriodicModelAverager`` and ``hierarchical_model_averager.HierarchicalModelAverager``
decide when to average, ``utils`` does it (one flat all-reduce); as in torch, importing the
package imports none of its modules.
"""
