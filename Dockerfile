# syntax=docker/dockerfile:1
# One image for every Kairos service; the command picks the service:
#   python -m services.admission | services.queueing | services.scheduler
#   | services.node_agent | services.monitor
# and the one-shot jobs: python -m kairos.topics, python -m kairos.migrate.

ARG PYTHON_IMAGE=python:3.11-slim

# --- build: turn the project into wheels (ours and every dependency) --------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Dependencies change less often than the code: resolve them from pyproject.toml first so
# the layer is cached across code-only changes.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
 && pip wheel --wheel-dir /wheels -r /tmp/requirements.txt
COPY . .
RUN pip wheel --no-deps --wheel-dir /wheels .

# --- runtime --------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
ARG KAIROS_UID=10001
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    KAIROS_HTTP_HOST=0.0.0.0 \
    KAIROS_HTTP_PORT=8080
# Only our own wheel and the wheels resolved above, offline (--no-index): nothing to pin here.
# hadolint ignore=DL3013
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels kairos \
 && groupadd --system --gid ${KAIROS_UID} kairos \
 && useradd --system --uid ${KAIROS_UID} --gid kairos --home-dir /home/kairos \
        --create-home --shell /usr/sbin/nologin kairos
WORKDIR /home/kairos
USER ${KAIROS_UID}:${KAIROS_UID}
EXPOSE 8080
# Liveness of whichever service runs; compose and Kubernetes define their own probes too.
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('KAIROS_HTTP_PORT', '8080'), timeout=2)"]
# Every container names its module (see docker-compose.yml, charts/kairos); admission by default.
CMD ["python", "-m", "services.admission"]
