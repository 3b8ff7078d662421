"""Real parts for imageforge's builds where the real download cannot be had here.

`python -m realparts efa-installer --version V --out DIR` writes an EFA installer stand-in,
`aws-efa-installer-V.tar.gz`, from Debian 12's real libfabric, rdma-core and Open MPI.
"""
