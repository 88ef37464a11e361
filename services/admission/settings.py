"""The gateway's settings, all read from ``KAIROS_*`` environment variables."""

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.config import CommonSettings


class SubmitLimit(BaseModel):
    rate_per_s: float = Field(ge=0, description="submits refilled per second; 0 = no limit")
    burst: int = Field(ge=1, description="submits allowed at once")


class AdmissionSettings(CommonSettings):
    service_name: str = "admission"
    http_port: int = 8000
    dev_token: str = ""  # the embedded stack sets one; empty = no development token
    max_page_size: int = 500
    # every request's body, on every route (limits.BodyLimit): larger is 413. A job spec's
    # YAML aliases, expanded, are held to it too (spec_body)
    max_request_bytes: int = Field(default=1024 * 1024, ge=1)
    # the Retry-After of a 503 while PostgreSQL is unreachable (db_errors)
    db_retry_after_s: int = Field(default=2, ge=1)
    # --- admission policy and job operations (routes/job_stream.py, routes/usage.py, policy) ---
    # per-tenant submit rate limit, a token bucket shared by every replica (PostgreSQL):
    # `submit_rate_per_s` refills, up to `submit_burst`; 0 turns the limit off. Lenient by
    # default; KAIROS_TENANT_SUBMIT_LIMITS='{"vision": {"rate_per_s": 2, "burst": 10}}'
    # sets one tenant's.
    submit_rate_per_s: float = Field(default=500.0, ge=0)
    submit_burst: int = Field(default=2000, ge=1)
    tenant_submit_limits: dict[str, SubmitLimit] = Field(default_factory=dict)
    # graceful overload (overload.py): a submit past either bound is 429 with Retry-After.
    # Submits one replica handles at once (0 = no bound; the next ones wait their turn,
    # and one that waited `submit_queue_wait_s` is refused), and how far behind the
    # platform may be in taking up accepted jobs, in seconds (0 = no bound), sampled this
    # often. 16 at once keep both cores busy while submits wait on PostgreSQL (within the
    # database pool) and take a client's 16 concurrent requests without a queue; more
    # only lengthen each one's turn on a saturated machine
    max_submits_in_flight: int = Field(default=16, ge=0)
    # how long a submit may wait for a slot: a burst into a queue that was empty within
    # `submit_burst_wait_s` may wait that long; once the queue has stood that long
    # (overload), `submit_queue_wait_s` at most
    submit_queue_wait_s: float = Field(default=0.5, gt=0)
    submit_burst_wait_s: float = Field(default=2.0, gt=0)
    max_intake_lag_s: float = Field(default=30.0, ge=0)
    intake_sample_s: float = Field(default=1.0, gt=0)
    # the submit path's reads of what rarely changes, kept this long per replica (0 = read
    # every time): a token's row (a revocation is seen at once on the replica that made
    # it, on the others within this) and the queues' settings (a read model of queueing's
    # events already, so a second of staleness is within what it always was)
    token_cache_s: float = Field(default=2.0, ge=0)
    queue_cache_s: float = Field(default=1.0, ge=0)
    # elements one job array may have (Slurm's MaxArraySize is 1001 by default): all are
    # stored in one transaction, so this bounds a submit's work
    max_array_size: int = Field(default=10_000, ge=1, le=100_000)
    max_job_gpus: int = Field(default=0, ge=0, description="whole GPUs a job may ask for "
                              "(at its largest size); 0 = no limit")
    # seconds between reads of new job events for the SSE streams (one query per
    # replica per interval, whatever the number of watchers), and between keep-alives
    stream_poll_s: float = Field(default=0.25, gt=0)
    stream_keepalive_s: float = Field(default=15.0, gt=0)
    # a stream open this long is closed without `end`; the client reconnects with
    # Last-Event-ID (SSE), so long watches spread again over the replicas
    stream_max_s: float = Field(default=3600.0, gt=0)
    # --- dry runs (dry_run.py) ---
    # the forecaster service a dry run asks when the job would start (POST /v1/what-if);
    # empty: none, a dry run answers without a forecast. 8005 is its default port
    forecaster_url: str = "http://127.0.0.1:8005"
    # a dry run waits this long for the forecast, then answers without one
    # a replay of a large cluster takes seconds; the wait is async (no worker is held)
    forecaster_timeout_s: float = Field(default=10.0, gt=0, le=60)


class LogProxySettings(BaseSettings):
    """How the gateway talks to agents for ``GET /v1/jobs/{id}/logs`` (the same
    ``KAIROS_AGENT_TOKEN`` as the agents)."""

    model_config = SettingsConfigDict(env_prefix="KAIROS_", extra="ignore")
    agent_token: str = ""
    agent_timeout_s: float = 10.0
