FROM imageforge/base:bookworm
ENV PATH="/opt/conda/bin${PATH:+:${PATH}}"
RUN echo bench-fixture-one > /one.txt
RUN --mount=type=bind,from=src-a,target=/src \
    cat /src/a.txt > /a.txt
RUN cat /one.txt /a.txt > /three.txt
ENV NCCL_VERSION="2.10.3"
