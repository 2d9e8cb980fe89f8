# The service image (the client is `pip install cachesvc` in your inference image).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY cachesvc ./cachesvc
COPY client ./client
COPY migrations ./migrations
RUN pip install --no-cache-dir '.[server]'
EXPOSE 8787
# Migrations first (the app refuses to start on a schema that is behind), then gunicorn;
# gunicorn reads its worker count from WEB_CONCURRENCY; metrics add up over workers through
# prometheus_client's multiprocess folder.
ENV PROMETHEUS_MULTIPROC_DIR=/tmp/cachesvc-metrics
CMD ["sh", "-c", "cachesvc db upgrade && rm -rf $PROMETHEUS_MULTIPROC_DIR && mkdir -p $PROMETHEUS_MULTIPROC_DIR && exec gunicorn --threads 8 --timeout 300 --bind 0.0.0.0:8787 'cachesvc.app:create_app()'"]
