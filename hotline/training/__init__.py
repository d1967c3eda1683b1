"""Training: the run's config (``config``), the DLRM model (``model``), the Trainer of one rank or N
(``trainer``), rank-aware checkpoints (``checkpoint``) and evaluation metrics (``metrics``).

``hotline.Trainer`` and ``hotline.TrainConfig`` are the short names (imported lazily)."""
