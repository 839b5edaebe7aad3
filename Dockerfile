# The controller image that k8s/base/deployment.yaml runs: `migscale controller`
# (leader-elected loop and metrics API) or `migscale api`. It needs no GPU and no
# Triton of its own; the Triton pods it deploys run NVIDIA's image.
#
#   docker build -t REGISTRY/migscale:0.1.0 .
#   docker push REGISTRY/migscale:0.1.0
#   (then point the Deployment at it: kustomize's `images:` in an overlay)
#
# Two stages: the wheel is built from the source, and only the wheel and its
# runtime dependencies reach the image (no tests, benchmarks or dev tools).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY autoscaler ./autoscaler
COPY loadtests ./loadtests
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
COPY --from=build /wheels /wheels
# Bytecode is compiled now: the Deployment's root filesystem is read-only.
RUN pip install --no-cache-dir /wheels/*.whl \
    && rm -rf /wheels \
    && python -m compileall -q "$(python -c 'import autoscaler, os; print(os.path.dirname(autoscaler.__file__))')"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MPLCONFIGDIR=/tmp/matplotlib
# The Deployment's runAsUser; no shell or home needed.
USER 65532:65532
ENTRYPOINT ["migscale"]
CMD ["--help"]
