"""The models: DLRM's dense and interaction layers, below the embedding tiers.

Tiers and training import from here; nothing here imports them (the embedding tables are supplied by a tier).
"""

from hotline.models.dlrm import DLRM, DLRMConfig, init_embedding_table, parse_layers

__all__ = ["DLRM", "DLRMConfig", "init_embedding_table", "parse_layers"]
