# The cachesvc service image (inference containers get the client alone: `pip install cachesvc`).
#   docker build -t cachesvc:0.1.0 .
#   docker run cachesvc:0.1.0 db upgrade     # migrations: a separate, one-shot command
#   docker run -p 8787:8787 cachesvc:0.1.0   # the service (gunicorn, access log on stdout)
# docker-compose.yml and deploy/kubernetes run exactly these two.

# python:3.11.15-slim-bookworm, pinned by the digest of its multi-platform index as
# docker-library/repo-info records it (repos/python/remote/3.11.15-slim-bookworm.md).
ARG BASE=python:3.11.15-slim-bookworm@sha256:d29f48a31a8b408ed19272ca1e7b10ebae13b240a27e862d3d4217c528e2e0c3

FROM ${BASE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/cachesvc
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY cachesvc ./cachesvc
COPY client ./client
COPY migrations ./migrations
RUN /opt/cachesvc/bin/pip install '.[server]'

FROM ${BASE}
# nginx in front of gunicorn (CACHESVC_SERVE_PROXY, cachesvc/cli/proxy.py): slow clients wait in nginx,
# not in a gunicorn thread. Debian's nginx-light: the proxy and nothing else.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nginx-light \
 && rm -rf /var/lib/apt/lists/*
# One unprivileged user; Kubernetes runs it by number (runAsUser: 10001, deploy/kubernetes).
RUN groupadd --system --gid 10001 cachesvc \
 && useradd --system --uid 10001 --gid cachesvc --home-dir /home/cachesvc --create-home \
        --shell /usr/sbin/nologin cachesvc \
 && install -d -o cachesvc -g cachesvc -m 0750 /var/lib/cachesvc
COPY --from=build /opt/cachesvc /opt/cachesvc
ENV PATH=/opt/cachesvc/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CACHESVC_DATA_DIR=/var/lib/cachesvc \
    CACHESVC_SERVE_PROXY=1
USER 10001:10001
WORKDIR /var/lib/cachesvc
EXPOSE 8787
# 200 when the database answers (GET /healthz); anything else, or no answer in 3 s, is unhealthy.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8787/healthz', timeout=3).status != 200)"]
# `cachesvc serve` runs nginx on the port and gunicorn behind it on a Unix socket: access log on stdout, errors on stderr, prometheus_client's
# multiprocess folder under CACHESVC_DATA_DIR, the GC scheduler in every worker. It migrates
# only the embedded SQLite default (CACHESVC_AUTO_MIGRATE); with PostgreSQL run `db upgrade` first.
ENTRYPOINT ["cachesvc"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8787", "--workers", "4"]
