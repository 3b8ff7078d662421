"""smddp: the SageMaker distributed data parallel image (seed 002), last stage.

Built FROM the efa stage (system packages stay intact), it gathers Python, NCCL, the plugin,
PyTorch, torchvision and boost, sets up OpenSSH for MPI between containers, installs the
SageMaker packages and finally the SMDDP wheel with `SMDATAPARALLEL_PT=1 pip install`.
The seed bakes one SSH private key into every copy of the image; that is off unless
`ssh_build_time_key = true`.

# Parameters
version, url, sha256: the SMDDP wheel (its file name carries the cpXY tag).
pip_packages: packages installed before the wheel (seed: mpi4py, sagemaker, ...).
s3_plugin_url, s3_plugin_sha256: optional PyTorch S3 plugin wheel (seed: awsio 0.0.1).
apt_packages: runtime packages (seed: jq libhwloc-dev libnuma1 libnuma-dev libssl1.1 ...).
openssh: set up OpenSSH for MPI (seed: yes).
ssh_build_time_key: bake an SSH key pair into the image like the seed (not recommended).

# Examples
```toml
[stages.smddp]
version = "1.4.0"
url = "https://smdataparallel.s3.amazonaws.com/binary/pytorch/1.10.2/cu113/2022-02-18/smdistributed_dataparallel-1.4.0-cp38-cp38-linux_x86_64.whl"
```
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from imageforge import smoke
from imageforge.dockerfile import apt_install, bind, run, sh
from imageforge.sources import Source, UrlSource
from imageforge.stage import Check, Context, Field, Stage, filename_of, url_fields, url_source

PIP = "/opt/conda/bin/pip"


def s3_plugin(ctx: Context) -> UrlSource | None:
    inputs = ctx.of("smddp")
    url = inputs.get("s3_plugin_url")
    if not url:
        return None
    return UrlSource(name="src-smddp-s3", url=str(url), sha256=inputs.get("s3_plugin_sha256"),
                     filename=filename_of(str(url)))


def sources(ctx: Context) -> Sequence[Source]:
    plugin = s3_plugin(ctx)
    return [url_source("smddp", ctx.of("smddp")), *([plugin] if plugin else [])]


def openssh_steps(ctx: Context) -> list[str]:
    inputs = ctx.of("smddp")
    steps = [apt_install(["openssh-client", "openssh-server"])] if ctx.image["apt"] else []
    # Seed: MPI's ssh between containers must not stop at host-key prompts.
    steps.append(run(
        "mkdir -p /var/run/sshd",
        "grep -v StrictHostKeyChecking /etc/ssh/ssh_config > /etc/ssh/ssh_config.new",
        'echo "    StrictHostKeyChecking no" >> /etc/ssh/ssh_config.new',
        "mv /etc/ssh/ssh_config.new /etc/ssh/ssh_config",
        r"sed 's@session\s*required\s*pam_loginuid.so@session optional pam_loginuid.so@g'"
        " -i /etc/pam.d/sshd",
    ))
    if inputs["ssh_build_time_key"]:
        steps.append(run(
            "rm -rf /root/.ssh/",
            "mkdir -p /root/.ssh/",
            "ssh-keygen -q -t rsa -N '' -f /root/.ssh/id_rsa",
            "cp /root/.ssh/id_rsa.pub /root/.ssh/authorized_keys",
            r'printf "Host *\n StrictHostKeyChecking no\n" >> /root/.ssh/config',
        ))
    return steps


def recipe(ctx: Context) -> str:
    inputs = ctx.of("smddp")
    steps = [apt_install(inputs["apt_packages"])] if ctx.image["apt"] else []
    if inputs["openssh"]:
        steps.extend(openssh_steps(ctx))
    if inputs["pip_packages"]:
        steps.append(run(sh(PIP, "install", "--no-cache-dir", "-U", *inputs["pip_packages"])))
    plugin = s3_plugin(ctx)
    if plugin:
        steps.append(run(sh(PIP, "install", "--no-cache-dir", "-U", f"/src/{plugin.filename}"),
                         mounts=[bind(plugin.name, "/src")]))
    # Seed: SageMaker's tooling looks for the CA bundle at the RHEL path.
    steps.append(run("mkdir -p /etc/pki/tls/certs",
                     "cp /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt"))
    wheel = url_source("smddp", inputs).filename
    steps.append(run(sh("env", "SMDATAPARALLEL_PT=1", PIP, "install", "--no-cache-dir",
                        f"/src/{wheel}"),
                     mounts=[bind("src-smddp", "/src")]))
    return "\n".join(steps)


def env_paths(ctx: Context) -> Mapping[str, Sequence[str]]:
    python = ctx.image["python"]
    lib = f"/opt/conda/lib/python{python}/site-packages/smdistributed/dataparallel/lib"
    return {"LD_LIBRARY_PATH": [lib]}


def env(ctx: Context) -> Mapping[str, str]:
    return {
        # Seed 002: lets SageMaker launch SMDDP through the PyTorch container's entry point.
        "SAGEMAKER_TRAINING_MODULE": "sagemaker_pytorch_container.training:main",
        "DLC_CONTAINER_TYPE": "training",
    }


def checks(ctx: Context) -> Sequence[Check]:
    version = str(ctx.of("smddp")["version"])
    # The native libraries load from the package's own lib/ directory, found through
    # LD_LIBRARY_PATH; where the wheel really put it is what the path must hold.
    lib_dir = ("lib=$(/opt/conda/bin/python -c 'import os, smdistributed.dataparallel as m; "
               'print(os.path.join(os.path.dirname(m.__file__), "lib"))\') || exit 1\n'
               'case ":${LD_LIBRARY_PATH-}:" in *":$lib:"*) echo "$lib is on LD_LIBRARY_PATH";;\n'
               '  *) echo "$lib is not on LD_LIBRARY_PATH=${LD_LIBRARY_PATH-}"; exit 1;; esac\n')
    return [
        Check(name=f"SMDDP {version} installed and imports",
              script=f"{PIP} show smdistributed-dataparallel | grep -qx "
                     f"{sh('Version: ' + version)} && /opt/conda/bin/python -c "
                     "'import smdistributed.dataparallel'"),
        Check(name="SMDDP native libraries link from a directory on LD_LIBRARY_PATH",
              script=lib_dir + smoke.links('"$lib"/*.so')),
    ]


STAGE = Stage(
    name="smddp",
    doc=__doc__ or "",
    deps=("efa", "python", "nccl", "aws-ofi-nccl", "pytorch", "torchvision", "boost"),
    parent="efa",
    image=True,
    fields={
        **url_fields(url="", what="SMDDP wheel"),
        "pip_packages": Field(
            kind="packages",
            default=["packaging", "mpi4py==3.0.3", "smclarify", "sagemaker>=2,<3",
                     "sagemaker-experiments==0.*", "sagemaker-pytorch-training"],
            help="pip packages installed before the wheel"),
        "s3_plugin_url": Field(kind="url", help="PyTorch S3 plugin wheel URL (optional)"),
        "s3_plugin_sha256": Field(kind="sha256", locked=True, help="its sha256 (lock)"),
        "apt_packages": Field(
            kind="packages",
            default=["jq", "libhwloc-dev", "libnuma1", "libnuma-dev", "libtool", "hwloc"],
            help="runtime packages installed with apt"),
        "openssh": Field(kind="bool", default=True, help="set up OpenSSH for MPI"),
        "ssh_build_time_key": Field(kind="bool", default=False,
                                    help="bake an SSH key pair into the image (seed behaviour)"),
    },
    sources=sources,
    recipe=recipe,
    env_paths=env_paths,
    env=env,
    checks=checks,
)
