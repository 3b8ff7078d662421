FROM imageforge/base:bookworm AS base

FROM base AS one
RUN --mount=type=bind,from=src-a,target=/tmp/a,rw \
    mkdir -p /out/opt/one && cp /tmp/a/file.txt /out/opt/one/ && echo building one

FROM base AS two
COPY --from=one /out/ /
ENV LD_LIBRARY_PATH="/opt/one/lib${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}" \
    PATH="/opt/one/bin${PATH:+:${PATH}}"
RUN echo "LD=$LD_LIBRARY_PATH PATH=$PATH" && cat /opt/one/file.txt
