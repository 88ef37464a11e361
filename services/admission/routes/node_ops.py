"""Node operations (admin): cordon, drain and uncordon; an admin's labels and taints.

The command is a ``NodeCommand`` on ``nodes.lifecycle``, written to the outbox in the
same transaction that moves the node's state in the read model, so it is never lost and
a second command sees the first at once. The scheduler applies it (and persists it in
``sched_nodes``): cordoned nodes get nothing new; a drain also stops the node's tasks
gracefully and requeues their jobs; it announces each state (``node.scheduling``),
``drained`` once nothing runs there.

Transitions (anything else is 409, saying why):

==========  ===============================  ==========
action      from                             to
==========  ===============================  ==========
cordon      schedulable                      cordoned
drain       schedulable, cordoned            draining (then drained)
uncordon    cordoned, draining, drained      schedulable
==========  ===============================  ==========
"""

from __future__ import annotations

import json

from fastapi import APIRouter, HTTPException, status
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.admission.auth import Principal
from services.admission.deps import Admin, EngineDep
from services.admission.models.nodes import (
    NodeCommandIn,
    NodeCommandOut,
    NodeLabelsIn,
    NodeLabelsOut,
    NodeTaintsIn,
)
from shared.events import NodeAction, NodeCommand, NodeLabels, NodeSchedulability
from shared.outbox import add_to_outbox

router = APIRouter(tags=["nodes"])

S = NodeSchedulability
FROM: dict[NodeAction, frozenset[S]] = {
    NodeAction.CORDON: frozenset({S.SCHEDULABLE}),
    NodeAction.DRAIN: frozenset({S.SCHEDULABLE, S.CORDONED}),
    NodeAction.UNCORDON: frozenset({S.CORDONED, S.DRAINING, S.DRAINED}),
}
TO = {NodeAction.CORDON: S.CORDONED, NodeAction.DRAIN: S.DRAINING,
      NodeAction.UNCORDON: S.SCHEDULABLE}
WHY_NOT = {
    (NodeAction.CORDON, S.CORDONED): "is already cordoned",
    (NodeAction.CORDON, S.DRAINING): "is being drained (already cordoned)",
    (NodeAction.CORDON, S.DRAINED): "is drained (already cordoned)",
    (NodeAction.DRAIN, S.DRAINING): "is already being drained",
    (NodeAction.DRAIN, S.DRAINED): "is already drained",
    (NodeAction.UNCORDON, S.SCHEDULABLE): "is not cordoned",
}


async def command_node(engine: AsyncEngine, node_id: str, action: NodeAction,
                       body: NodeCommandIn, caller: Principal) -> NodeCommandOut:
    async with engine.begin() as conn:
        row = (await conn.execute(
            text("SELECT scheduling, scheduling_generation FROM nodes_view"
                 " WHERE node_id = :n FOR UPDATE"), {"n": node_id})).first()
        if row is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no node {node_id}")
        current = S(row.scheduling)
        if current not in FROM[action]:
            raise HTTPException(status.HTTP_409_CONFLICT, detail=(
                f"cannot {action.value} node {node_id}: it {WHY_NOT[(action, current)]}"))
        generation = int(row.scheduling_generation) + 1
        target = TO[action]
        reason = body.reason or f"{action.value} by {caller.user}"
        await conn.execute(
            text("""UPDATE nodes_view SET scheduling = :s, scheduling_generation = :g,
                        scheduling_reason = :r WHERE node_id = :n"""),
            {"n": node_id, "s": target.value, "g": generation, "r": reason})
        await add_to_outbox(conn, NodeCommand(
            node_id=node_id, action=action, generation=generation, reason=reason,
            requested_by=caller.user, grace_period_s=body.grace_period_s), "admission",
            event_id=f"node-{action.value}-{node_id}-g{generation}")
    return NodeCommandOut(node_id=node_id, action=action, scheduling=target,
                          generation=generation, requested_by=caller.user, reason=reason)


def _route(action: NodeAction, doc: str) -> None:
    async def endpoint(node_id: str, caller: Admin, engine: EngineDep,
                       body: NodeCommandIn | None = None) -> NodeCommandOut:
        return await command_node(engine, node_id, action, body or NodeCommandIn(), caller)

    endpoint.__doc__ = doc
    router.add_api_route(f"/v1/nodes/{{node_id}}/{action.value}", endpoint, methods=["POST"],
                         status_code=202, response_model=NodeCommandOut,
                         name=f"{action.value}_node",
                         responses={403: {"description": "not an admin token"},
                                    404: {"description": "no such node"},
                                    409: {"description": "the node is already in that state"}})


_route(NodeAction.CORDON, "Cordon a node (admin): nothing new is placed on it; what runs "
       "there goes on.")
_route(NodeAction.DRAIN, "Drain a node (admin): cordon it, and stop its tasks gracefully "
       "(checkpoint signal, grace period); their jobs are requeued, not failed.")
_route(NodeAction.UNCORDON, "Uncordon a node (admin): it takes new work again.")


async def set_labels(engine: AsyncEngine, node_id: str, caller: Principal,
                     labels: dict[str, str] | None = None,
                     taints: list[str] | None = None) -> NodeLabelsOut:
    """Replace an admin's labels or taints of a node (the other stays), in the read model
    and, through the outbox in the same transaction, for the scheduler."""
    async with engine.begin() as conn:
        row = (await conn.execute(text(
            "SELECT admin_labels, admin_taints, labels_generation FROM nodes_view"
            " WHERE node_id = :n FOR UPDATE"), {"n": node_id})).first()
        if row is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no node {node_id}")
        labels = dict(row.admin_labels or {}) if labels is None else labels
        taints = list(row.admin_taints or []) if taints is None else taints
        generation = int(row.labels_generation) + 1
        await conn.execute(text(
            """UPDATE nodes_view SET admin_labels = CAST(:l AS jsonb),
                   admin_taints = CAST(:t AS jsonb), labels_generation = :g
               WHERE node_id = :n"""),
            {"n": node_id, "l": json.dumps(labels), "t": json.dumps(taints), "g": generation})
        await add_to_outbox(conn, NodeLabels(
            node_id=node_id, labels=labels, taints=taints, generation=generation,
            requested_by=caller.user), "admission",
            event_id=f"node-labels-{node_id}-g{generation}")
    return NodeLabelsOut(node_id=node_id, labels=labels, taints=taints,
                         generation=generation, requested_by=caller.user)


_ADMIN = {403: {"description": "not an admin token"}, 404: {"description": "no such node"}}


@router.put("/v1/nodes/{node_id}/labels", response_model=NodeLabelsOut, responses=_ADMIN)
async def put_node_labels(node_id: str, body: NodeLabelsIn, caller: Admin,
                          engine: EngineDep) -> NodeLabelsOut:
    """Set an admin's labels of a node (admin), over its agent's: the whole set, as
    `kubectl label` leaves it; jobs reach them with nodeSelector. Kept across restarts."""
    return await set_labels(engine, node_id, caller, labels=body.labels)


@router.put("/v1/nodes/{node_id}/taints", response_model=NodeLabelsOut, responses=_ADMIN)
async def put_node_taints(node_id: str, body: NodeTaintsIn, caller: Admin,
                          engine: EngineDep) -> NodeLabelsOut:
    """Set an admin's taints of a node (admin), beside its agent's: the whole set;
    NoSchedule and NoExecute keep out jobs that do not tolerate them. Running tasks stay."""
    return await set_labels(engine, node_id, caller, taints=body.taints)
