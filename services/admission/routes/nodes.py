"""Nodes: the cluster as admission's read model knows it."""

from __future__ import annotations

from fastapi import APIRouter

from services.admission import store
from services.admission.deps import Caller, EngineDep
from services.admission.models.nodes import NodeOut, node_out

router = APIRouter()


@router.get("/v1/nodes", response_model=list[NodeOut])
async def list_nodes(caller: Caller, engine: EngineDep) -> list[NodeOut]:
    """Nodes and their allocations; a user token sees which GPUs are taken, but not
    the jobs of other tenants that hold them."""
    return [node_out(n, None if caller.admin else caller.tenant)
            for n in await store.list_nodes(engine)]
