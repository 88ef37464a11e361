"""Every policy plugin; importing this package registers them by name."""

from scheduling.plugins import fairshare, fgd, kairos_pack, ordering, placement, predicates, special

__all__ = ["fairshare", "fgd", "kairos_pack", "ordering", "placement", "predicates", "special"]
