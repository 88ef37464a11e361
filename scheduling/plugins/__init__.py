"""Every policy plugin; importing this package registers them by name."""

from scheduling.plugins import (
    affinity,
    fairshare,
    fgd,
    gang,
    kairos_pack,
    ordering,
    placement,
    predicates,
    srpt,
    throughput,
)

__all__ = ["affinity", "fairshare", "fgd", "gang", "kairos_pack", "ordering", "placement", "predicates", "srpt", "throughput"]
