# vllm-specdec-exporter: a small, non-root image that runs with a read-only root
# filesystem. Build: docker build --build-arg REVISION=$(git rev-parse --short=12 HEAD) -t vllm-specdec-exporter .
# The base image is pinned by digest (python:3.11.16-slim-bookworm, index digest from
# docker-library/repo-info) and the dependencies by hash (requirements.lock), so two
# builds of one commit install the same bytes.
ARG BASE=python:3.11.16-slim-bookworm@sha256:0bee7276f83efd4a1ee05bbbf4281d95ed28e079220a9457f25a93e3f1e3c31b
FROM ${BASE} AS build
WORKDIR /src
# Runtime dependencies from the hash-pinned lock (no test tooling), then the
# package itself without re-resolving them. The lock's steps come first in both
# stages, so that a change to the code alone reuses their layers.
COPY requirements.lock ./
RUN pip download --no-cache-dir --require-hashes --dest /wheels -r requirements.lock
COPY pyproject.toml README.md ./
COPY exporter ./exporter
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /package .

FROM ${BASE}
COPY --from=build /wheels /wheels
COPY requirements.lock /tmp/requirements.lock
RUN pip install --no-cache-dir --no-index --find-links=/wheels --require-hashes -r /tmp/requirements.lock \
    && rm -rf /wheels /tmp/requirements.lock
COPY --from=build /package /package
RUN pip install --no-cache-dir --no-index --no-deps --find-links=/package vllm-specdec-exporter \
    && rm -rf /package
# build_info's revision label: docker build --build-arg REVISION=$(git rev-parse --short=12 HEAD)
ARG REVISION=unknown
# Nothing is written at run time: no .pyc, no temp files, no home directory.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    VLLM_SPECDEC_EXPORTER_REVISION=${REVISION}
USER 65532:65532
EXPOSE 9746
ENTRYPOINT ["vllm-specdec-exporter"]
CMD ["serve", "--config.file=/etc/vllm-specdec-exporter/config.yaml"]
