# One image for both processes: `zeroscale serve` (the default) and `zeroscale proxy`.
# Build: docker build -t ghcr.io/zeroscale/zeroscale:0.1.0 .
# tests/deploy/test_dockerfile.py lints this file (hadolint) and runs the build stage's RUN steps in a fresh venv.

# --- build: a wheel of this project, installed with its dependencies into a virtual environment ---
FROM python:3.11-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    VENV=/opt/zeroscale \
    WHEELS=/tmp/wheels
WORKDIR /src
COPY pyproject.toml README.md ./
COPY adapter ./adapter
# Every dependency ships manylinux wheels (uvloop, httptools, hiredis, grpcio, cryptography): no compiler here
# either, and --only-binary makes a missing wheel an error instead of a silent source build.
RUN python -m venv "$VENV" \
    && "$VENV/bin/pip" wheel --no-deps --wheel-dir "$WHEELS" . \
    && "$VENV/bin/pip" install --only-binary=:all: "$WHEELS"/zeroscale-*.whl \
    && "$VENV/bin/zeroscale" --version

# --- final: the same slim base, the virtual environment only, a non-root user ---
FROM python:3.11-slim-bookworm
ENV PATH=/opt/zeroscale/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --system --gid 65532 zeroscale \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin zeroscale
COPY --from=build /opt/zeroscale /opt/zeroscale
# Numeric, so runAsNonRoot can verify it without resolving a name.
USER 65532:65532
EXPOSE 6443 8080 9090 9091 9443
ENTRYPOINT ["zeroscale"]
CMD ["serve", "--config", "/etc/zeroscale/config/config.yaml"]
