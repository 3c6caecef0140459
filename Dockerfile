# One image for the four services: `dralloc run allocator|ingestor|statuswriter|discovery`.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY schemas/ schemas/
COPY services/ services/
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[otlp]'

FROM python:3.11-slim
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin dralloc
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels 'dralloc[otlp]' && rm -rf /wheels
USER 10001:10001
# The services log to stderr and keep no state on disk (state lives in JetStream).
ENV PYTHONUNBUFFERED=1
ENTRYPOINT ["dralloc"]
CMD ["--help"]
