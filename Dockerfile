# vllm-specdec-exporter: a small, non-root image that runs with a read-only root
# filesystem. Build: docker build -t vllm-specdec-exporter .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
# Wheels for the package and its runtime dependencies only (no test tooling).
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links=/wheels vllm-specdec-exporter \
    && rm -rf /wheels
# Nothing is written at run time: no .pyc, no temp files, no home directory.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
EXPOSE 9746
ENTRYPOINT ["vllm-specdec-exporter"]
CMD ["serve", "--config.file=/etc/vllm-specdec-exporter/config.yaml"]
