"""The forecaster: every waiting job's expected start, finish, nodes and band, published
on ``jobs.forecasts``, and ``POST /v1/what-if`` for the gateway's dry runs.

Why a part of the scheduler service, run as a process of its own
(``python -m services.scheduler.forecaster``): it reads the scheduler leader's persisted
rows (``sched_jobs``, ``sched_nodes``, as ``SchedulerService.load`` does) and builds the
core's ``Snapshot`` with the scheduler's own translation (``services/scheduler/snapshot``),
so a forecast sees exactly what the next cycle sees, with the same policy file. But a
round replays the cluster forward through many cycles; in the leader's event loop it
would delay scheduling cycles, so it runs apart: it never holds the lease, never writes
the scheduler's rows, and scales and restarts on its own (a crash loses nothing: the next
round starts from the rows). Replicas all forecast and answer what-ifs; the one elected
through a PostgreSQL advisory lock publishes.

- ``load.py``: the rows into a snapshot; finished jobs' durations; jobs waiting for quota;
- ``round.py``: one round, pure: snapshot and history in, forecasts out; the what-if;
- ``quota.py``: queueing's quota rule, which admits jobs held for quota in the replay;
- ``publish.py``: which forecasts moved enough to publish again;
- ``service.py``: the loop, the producer, metrics and the HTTP app.
"""
