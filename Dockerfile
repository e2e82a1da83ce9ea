# raftcron's image: the wheel built from this checkout, installed into a venv on Debian
# bookworm's python3 (3.11). docs/operations/containers.md.
#
#   docker build -t raftcron .            (podman build -t raftcron . the same)
#   docker run ... raftcron               (a node: `raftcron node`, configured by RAFTCRON_*)
#   docker run ... raftcron worker ...    (a worker; any other `raftcron` command likewise)
#
# compose.yaml runs three nodes and a worker from it; deploy/kubernetes/ runs it as a
# StatefulSet (its user, data path and ports are this image's).

# What the final image runs on, and the build starts from (one apt step for both).
# python3: the venv's interpreter. tini: PID 1 (see ENTRYPOINT). ca-certificates: the
# worker's http task and a node's outgoing HTTPS verify public servers against them.
FROM debian:bookworm-slim AS runtime
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 tini ca-certificates \
 && rm -rf /var/lib/apt/lists/*

FROM runtime AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-venv \
 && rm -rf /var/lib/apt/lists/*
# The venv at the path it has in the final image (its python is a link to /usr/bin/python3,
# the runtime stage's).
RUN python3 -m venv /opt/raftcron
# pip reaches the index over HTTPS. Behind a proxy that re-signs TLS with its own CA, give
# the build that CA (never stored in a layer):
#   docker build --secret id=ca-certificates,src=/etc/ssl/certs/ca-certificates.crt ...
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# The pinned dependencies first, from pyproject.toml alone: a change to the code rebuilds only
# the layers below. (--use-pep517: pysyncobj comes as a source distribution, built into a
# wheel in an isolated environment too, not by the deprecated `setup.py install`.)
COPY pyproject.toml /src/pyproject.toml
RUN --mount=type=secret,id=ca-certificates,target=/run/secrets/ca-certificates \
    if [ -e /run/secrets/ca-certificates ]; then export PIP_CERT=/run/secrets/ca-certificates; fi \
 && /opt/raftcron/bin/python -c 'import tomllib; \
print("\n".join(tomllib.load(open("/src/pyproject.toml", "rb"))["project"]["dependencies"]))' \
      > /src/requirements.txt \
 && /opt/raftcron/bin/pip install --use-pep517 -r /src/requirements.txt
COPY . /src
# pip builds the wheel in an isolated environment (setuptools>=77 and wheel from the index).
RUN --mount=type=secret,id=ca-certificates,target=/run/secrets/ca-certificates \
    if [ -e /run/secrets/ca-certificates ]; then export PIP_CERT=/run/secrets/ca-certificates; fi \
 && /opt/raftcron/bin/pip wheel --no-deps -w /wheels /src \
 && /opt/raftcron/bin/pip install /wheels/raftcron-*.whl \
 && /opt/raftcron/bin/pip check

FROM runtime
# uid and gid 10001, as deploy/kubernetes/ runs the pods (runAsUser, fsGroup).
RUN groupadd --gid 10001 raftcron \
 && useradd --uid 10001 --gid raftcron --no-create-home \
      --home-dir /var/lib/raftcron --shell /usr/sbin/nologin raftcron \
 && install -d -o raftcron -g raftcron -m 0750 /var/lib/raftcron
COPY --from=build /opt/raftcron /opt/raftcron
ENV PATH=/opt/raftcron/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
# The node's data dir: set RAFTCRON_DATA_DIR=/var/lib/raftcron (compose.yaml and the
# Kubernetes manifests do). Without it a node keeps its data in data/<node_id> under the
# current folder, which is this one, so still in the volume. No RAFTCRON_* variable is set
# here: a node refuses a key set both in its config file and in the environment.
WORKDIR /var/lib/raftcron
VOLUME ["/var/lib/raftcron"]
EXPOSE 7000 8080
# tini is PID 1 and runs raftcron as its child: it passes SIGTERM on and reaps orphans. As
# PID 1 itself, a node would not stop on SIGTERM before it installs its handler (while it asks
# its peers, or replays its log: `docker stop` would wait for its SIGKILL), and the
# processes a worker's shell jobs leave behind would never be reaped.
ENTRYPOINT ["/usr/bin/tini", "--", "raftcron"]
CMD ["node"]
