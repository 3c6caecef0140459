# One image for the four services: `dralloc run allocator|ingestor|statuswriter|discovery`.
# The allocator runs the native engine (README "Native build": the same sources compiled by mypyc;
# the Numbers section gives its rates beside the pure-Python package's). It is compiled where a C
# compiler is (the full python image) and the wheel installed on the slim one: the same CPython,
# its minor version set by PYTHON for both stages, since an extension is built for one.
ARG PYTHON=3.11

FROM python:${PYTHON} AS build
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY schemas/ schemas/
COPY services/ services/
# --no-build-isolation: mypyc (mypy, which setup.py imports only with DRALLOC_NATIVE=1) type-checks
# the compiled modules against what they import, so the build sees the installed dependencies
RUN pip install --no-cache-dir 'mypy>=1.10,<2' 'setuptools>=70.1' '.[otlp]' \
 && DRALLOC_NATIVE=1 pip wheel --no-cache-dir --no-build-isolation --wheel-dir /wheels '.[otlp]'

FROM python:${PYTHON}-slim
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin dralloc
COPY --from=build /wheels /wheels
# the build fails here, not in production, if the engine did not come out compiled
RUN pip install --no-cache-dir --no-index --find-links /wheels 'dralloc[otlp]' && rm -rf /wheels \
 && python -c "import sys; from dralloc.allocator.engine import compiled; sys.exit(0 if compiled() else 'dralloc: the engine is not compiled')"
USER 10001:10001
# The services log to stderr and keep no state on disk (state lives in JetStream).
ENV PYTHONUNBUFFERED=1
ENTRYPOINT ["dralloc"]
CMD ["--help"]
