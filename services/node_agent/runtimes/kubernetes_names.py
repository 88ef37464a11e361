"""The names Kairos gives its Kubernetes objects: Pods, a gang's headless Service, label
values. Pure (no client import), so the agent can name a session's Service without
loading the ``kubernetes`` client.

A Pod's name derives from its task key, so a redelivered binding meets 409 AlreadyExists.
Every Pod of a job attempt is named in DNS as ``rank-<rank>.<gang>.<namespace>.svc``:
its ``hostname`` is ``rank-<rank>``, its ``subdomain`` the gang's headless Service.
"""

from __future__ import annotations

import hashlib
import re


def label_value(text: str) -> str:
    """A valid label value: <= 63 of [A-Za-z0-9._-], alphanumeric at both ends."""
    value = re.sub(r"[^A-Za-z0-9._-]", "-", text)[:63]
    return value.strip("._-") or "x"


def pod_name(key: str) -> str:
    slug = re.sub(r"[^a-z0-9-]", "-", key.lower().replace("/", "-"))
    digest = hashlib.sha1(key.encode()).hexdigest()[:10]
    return f"kairos-{slug[:45].strip('-')}-{digest}"  # a DNS label, unique per key


def gang_service(job_id: str, attempt: int) -> str:
    """The headless Service of a job attempt: a DNS-1035 label (<= 63, starts with a
    letter), the same on every node."""
    digest = hashlib.sha1(f"{job_id}/{attempt}".encode()).hexdigest()[:8]
    tail = f"-a{attempt}-{digest}"
    slug = re.sub(r"[^a-z0-9-]", "-", job_id.lower())[:63 - 3 - len(tail)].strip("-")
    return f"kj-{slug}{tail}" if slug else f"kj{tail}"


def pod_hostname(rank: int) -> str:
    return f"rank-{rank}"


def peer_host(job_id: str, attempt: int, rank: int, namespace: str) -> str:
    """The DNS name of the Pod of rank ``rank`` of a job attempt (any node)."""
    return f"{pod_hostname(rank)}.{gang_service(job_id, attempt)}.{namespace}.svc"
