"""Where embedding rows live, and one exact training step over them.

- ``base``: the TrainMode interface, step statistics, pooling and the loss;
- ``device``: every row on the compute device (the reference);
- ``cold_store`` / ``sharded_store``: the cold tier's seam and its one-rank and N-rank stores;
- ``replicated``: rows replicated on every rank and the exchange of their sparse gradients;
- ``tiered``: the ``hotline`` and ``hybrid`` modes over a hot tier and a cold store;
- ``sparse_optim``: the sparse optimizers; ``build``: the mode a TrainConfig asks for.
"""
