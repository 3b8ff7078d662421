# Benchmark baseline generated from bench.toml: seed 002's single linear chain, running the
# stage recipes' own commands. Do not edit: `invoke bench` writes it for every scenario.

# Each run builds it FROM a copy of this base with one file naming the run.
FROM imageforge/base:bookworm
ENV LD_LIBRARY_PATH="/opt/conda/lib/python3.11/site-packages/smdistributed/dataparallel/lib:/usr/local/lib:/opt/conda/lib:/opt/amazon/efa/lib:/opt/amazon/openmpi/lib${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}" \
    PATH="/opt/conda/bin:/opt/amazon/openmpi/bin:/opt/amazon/efa/bin${PATH:+:${PATH}}"

# ---- efa ----
RUN --mount=type=bind,from=src-efa,target=/src \
    mkdir /tmp/efa \
    && cd /tmp/efa \
    && tar -xf /src/aws-efa-installer-1.14.1.tar.gz \
    && cd aws-efa-installer \
    && ./efa_installer.sh -y --skip-kmod -g \
    && rm -rf /tmp/efa

# ---- python ----
RUN python3 -m venv --system-site-packages /opt/conda \
    && /opt/conda/bin/python -c 'import sys; v = "%d.%d" % sys.version_info[:2]; assert v == "3.11", v'

# ---- nccl ----
RUN --mount=type=bind,from=src-nccl,target=/tmp/nccl,rw --mount=type=cache,id=imageforge-ccache,target=/root/.ccache \
    export CCACHE_DIR=/root/.ccache PATH="/usr/lib/ccache:$PATH" \
    && cd /tmp/nccl \
    && make -j"$(nproc)" src.build CUDA_HOME=/usr/local/cuda 'NVCC_GENCODE=-gencode=arch=compute_70,code=sm_70 -gencode=arch=compute_80,code=sm_80' BUILDDIR=/tmp/nccl-build \
    && make pkg.txz.build CUDA_HOME=/usr/local/cuda BUILDDIR=/tmp/nccl-build \
    && mkdir -p /out/opt/conda \
    && tar -xvf /tmp/nccl-build/pkg/txz/nccl_*.txz -C /out/opt/conda --strip-components=1 \
    && rm -rf /tmp/nccl-build \
    && cp -a /out/. / && rm -rf /out

# ---- pytorch ----
RUN --mount=type=bind,from=src-pytorch,target=/tmp/pytorch,rw --mount=type=cache,id=imageforge-ccache,target=/root/.ccache \
    export CCACHE_DIR=/root/.ccache PATH="/usr/lib/ccache:$PATH" \
    && cd /tmp/pytorch \
    && env USE_SYSTEM_NCCL=1 NCCL_ROOT=/opt/conda NCCL_INCLUDE_DIR=/opt/conda/include NCCL_LIB_DIR=/opt/conda/lib 'TORCH_CUDA_ARCH_LIST=3.7 5.0 7.0+PTX 8.0' 'TORCH_NVCC_FLAGS=-Xfatbin -compress-all' CMAKE_PREFIX_PATH=/opt/conda CUDA_HOME=/usr/local/cuda MAX_JOBS=2 /opt/conda/bin/python setup.py install --root=/out \
    && cp -a /out/. / && rm -rf /out

# ---- aws-ofi-nccl ----
RUN --mount=type=bind,from=src-aws-ofi-nccl,target=/tmp/aws-ofi-nccl,rw \
    cd /tmp/aws-ofi-nccl \
    && ./autogen.sh \
    && ./configure --with-libfabric=/opt/amazon/efa --with-mpi=/opt/amazon/openmpi --with-cuda=/usr/local/cuda --with-nccl=/opt/conda --prefix=/usr/local \
    && make -j"$(nproc)" \
    && make install DESTDIR=/out \
    && cp -a /out/. / && rm -rf /out

# ---- torchvision ----
RUN --mount=type=bind,from=src-torchvision,target=/tmp/vision,rw \
    cd /tmp/vision \
    && env BUILD_VERSION=0.11.3 /opt/conda/bin/python setup.py install --root=/out \
    && cp -a /out/. / && rm -rf /out

# ---- openssh ----
RUN mkdir -p /var/run/sshd \
    && grep -v StrictHostKeyChecking /etc/ssh/ssh_config > /etc/ssh/ssh_config.new \
    && echo "    StrictHostKeyChecking no" >> /etc/ssh/ssh_config.new \
    && mv /etc/ssh/ssh_config.new /etc/ssh/ssh_config \
    && sed 's@session\s*required\s*pam_loginuid.so@session optional pam_loginuid.so@g' -i /etc/pam.d/sshd

# ---- boost ----
RUN --mount=type=bind,from=src-boost,target=/src \
    mkdir -p /tmp/boost \
    && tar -xzf /src/boost_1_73_0.tar.gz -C /tmp/boost \
    && cd /tmp/boost/boost_1_73_0 \
    && ./bootstrap.sh \
    && ./b2 -j"$(nproc)" --prefix=/out/opt/conda threading=multi cxxflags=-fPIC cflags=-fPIC install \
    && rm -rf /tmp/boost \
    && cp -a /out/. / && rm -rf /out

# ---- smddp ----
RUN mkdir -p /etc/pki/tls/certs \
    && cp /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt
RUN --mount=type=bind,from=src-smddp,target=/src \
    env SMDATAPARALLEL_PT=1 /opt/conda/bin/pip install --no-cache-dir /src/smdistributed_dataparallel-1.4.0-cp311-cp311-linux_x86_64.whl

ENV EFA_VERSION="1.14.1" \
    RDMAV_FORK_SAFE="1" \
    NCCL_VERSION="2.10.3" \
    SAGEMAKER_TRAINING_MODULE="sagemaker_pytorch_container.training:main" \
    DLC_CONTAINER_TYPE="training"
