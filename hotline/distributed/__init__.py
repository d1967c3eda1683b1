"""Data-parallel runs on torch.distributed: collectives (``comm``) and starting the ranks (``launcher``).

The tiered maths of N ranks lives with that of one rank in ``hotline.tiers`` (a sharded cold store), the
training loop in ``hotline.training.trainer``: nothing here computes a step."""
