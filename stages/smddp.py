"""smddp: the SageMaker distributed data parallel image (seed 002), last stage.

Built FROM the efa stage (system packages stay intact), it gathers Python, NCCL, the plugin,
PyTorch, torchvision, boost and the SageMaker training toolkit, sets up OpenSSH for MPI
between containers, installs the SageMaker packages and finally the SMDDP wheel with
`SMDATAPARALLEL_PT=1 pip install`.

SageMaker runs the image as `docker run IMAGE train`. The image's entry point gives each
container its own SSH host keys when it starts and installs the job's SSH key for root from
the `ssh` input channel (/opt/ml/input/data/ssh/id_ed25519, which `invoke run-local` makes per
job); without one it generates a key for this container only. The seed instead bakes one
private key into every copy of the image: anyone holding the image can then log in to every
running job. That is off unless `ssh_build_time_key = true`, which `invoke check` and
`invoke build` warn about.

# Parameters
version, url, sha256: the SMDDP wheel (its file name carries the cpXY tag).
pip_packages: packages installed before the wheel (seed: mpi4py, sagemaker, ...); `invoke
    lock` pins them, with the training toolkit's, to exact versions and hashes.
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

from imageforge.stageapi import (
    Check,
    Context,
    Field,
    Source,
    Stage,
    UrlSource,
    apt_commands,
    apt_install,
    bind,
    filename_of,
    pipinstall,
    run,
    sh,
    smoke,
    url_fields,
    url_source,
)
from stages import sagemaker_training
from stages.smddp_rules import RULES

PIP = "/opt/conda/bin/pip"


def s3_plugin(ctx: Context) -> UrlSource | None:
    inputs = ctx.of("smddp")
    url = inputs.get("s3_plugin_url")
    if not url:
        return None
    return UrlSource(name="src-smddp-s3", url=str(url), sha256=inputs.get("s3_plugin_sha256"),
                     filename=filename_of(str(url)), pin_key="s3_plugin_sha256")


def sources(ctx: Context) -> Sequence[Source]:
    plugin = s3_plugin(ctx)
    return [url_source("smddp", ctx.of("smddp")), *([plugin] if plugin else [])]


ENTRYPOINT = "/usr/local/bin/imageforge-entrypoint"
# Runs before `train`: SSH keys made when the container starts, never baked into the image.
ENTRYPOINT_FILE = f"""COPY --chmod=755 <<'EOF' {ENTRYPOINT}
#!/bin/sh
# SageMaker starts a training container as `docker run IMAGE train`. Before the toolkit runs,
# this container gets its own SSH host keys and root gets the job's key (input channel `ssh`),
# so MPI reaches the other hosts without one private key baked into every copy of the image.
set -eu
if [ "${{1-}}" = train ] && [ -x /usr/sbin/sshd ]; then
    ssh-keygen -A >/dev/null
    mkdir -p /root/.ssh /var/run/sshd
    chmod 700 /root/.ssh
    channel=${{SM_CHANNEL_SSH:-/opt/ml/input/data/ssh}}
    if [ -f "$channel/id_ed25519" ]; then
        install -m 600 "$channel/id_ed25519" /root/.ssh/id_ed25519
        install -m 644 "$channel/id_ed25519.pub" /root/.ssh/id_ed25519.pub
    elif [ ! -f /root/.ssh/id_ed25519 ] && [ ! -f /root/.ssh/id_rsa ]; then
        ssh-keygen -q -t ed25519 -N '' -f /root/.ssh/id_ed25519
        echo "imageforge: no job SSH key in $channel; other hosts cannot log in here" >&2
    fi
    for pub in /root/.ssh/id_*.pub; do
        grep -qxF "$(cat "$pub")" /root/.ssh/authorized_keys 2>/dev/null ||
            cat "$pub" >> /root/.ssh/authorized_keys
    done
    chmod 600 /root/.ssh/authorized_keys
fi
exec "$@"
EOF"""


def openssh_steps(ctx: Context) -> list[str]:
    inputs = ctx.of("smddp")
    install = apt_commands(["openssh-client", "openssh-server"]) if ctx.image["apt"] else []
    # Seed: MPI's ssh between containers must not stop at host-key prompts.
    steps = [run(
        *install,
        # Installing openssh-server makes host keys; in the same step, so that no layer keeps
        # them: each container makes its own when it starts (the entry point).
        "rm -f /etc/ssh/ssh_host_*",
        "mkdir -p /var/run/sshd",
        "grep -v StrictHostKeyChecking /etc/ssh/ssh_config > /etc/ssh/ssh_config.new",
        'echo "    StrictHostKeyChecking no" >> /etc/ssh/ssh_config.new',
        "mv /etc/ssh/ssh_config.new /etc/ssh/ssh_config",
        r"sed 's@session\s*required\s*pam_loginuid.so@session optional pam_loginuid.so@g'"
        " -i /etc/pam.d/sshd",
    )]
    steps.append(ENTRYPOINT_FILE)
    steps.append(f'ENTRYPOINT ["{ENTRYPOINT}"]')
    if inputs["ssh_build_time_key"]:
        steps.append(run(
            "rm -rf /root/.ssh/",
            "mkdir -p /root/.ssh/",
            "ssh-keygen -q -t rsa -N '' -f /root/.ssh/id_rsa",
            "cp /root/.ssh/id_rsa.pub /root/.ssh/authorized_keys",
            r'printf "Host *\n StrictHostKeyChecking no\n" >> /root/.ssh/config',
        ))
    return steps


def pip_requirements(ctx: Context) -> list[str]:
    """The seed's SageMaker packages, resolved together with the training toolkit's pins so
    that none of them moves what the sagemaker-training stage installed (the seed's `pip
    install -U` did: an unpinned sagemaker-pytorch-training replaced the pinned one)."""
    packages = list(ctx.of("smddp")["pip_packages"])
    return [*sagemaker_training.requirements(ctx), *packages] if packages else []


def recipe(ctx: Context) -> str:
    inputs = ctx.of("smddp")
    steps = [apt_install(inputs["apt_packages"])] if ctx.image["apt"] else []
    if inputs["openssh"]:
        steps.extend(openssh_steps(ctx))
    wanted = pip_requirements(ctx)
    if wanted:
        steps.extend(pipinstall.install("smddp", inputs, wanted, PIP))
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


def warnings(ctx: Context) -> Sequence[str]:
    if not ctx.of("smddp")["ssh_build_time_key"]:
        return []
    return ["stages.smddp.ssh_build_time_key = true bakes one SSH private key into every copy "
            "of the image: whoever has the image can log in to every job running it; set it "
            "to false (keys are then made when each container starts)."]


def env_paths(ctx: Context) -> Mapping[str, Sequence[str]]:
    python = ctx.image["python"]
    lib = f"/opt/conda/lib/python{python}/site-packages/smdistributed/dataparallel/lib"
    return {"LD_LIBRARY_PATH": [lib]}


def env(_ctx: Context) -> Mapping[str, str]:
    return {"DLC_CONTAINER_TYPE": "training"}


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
    deps=("efa", "python", "nccl", "aws-ofi-nccl", "pytorch", "torchvision", "boost",
          "sagemaker-training"),
    parent="efa",
    image=True,
    tag_template="{name}:pt{pytorch}-cu{cuda_nodot}-py{python_nodot}-efa{efa}-{date}",
    fields={
        **url_fields(url="", what="SMDDP wheel"),
        "pip_packages": Field(
            kind="packages",
            default=["packaging", "mpi4py==3.0.3", "smclarify", "sagemaker>=2,<3",
                     "sagemaker-experiments==0.*"],
            help="pip packages installed before the wheel"),
        "s3_plugin_url": Field(kind="url", locates="s3_plugin_sha256",
                               help="PyTorch S3 plugin wheel URL (optional)"),
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
    pip_requirements=pip_requirements,
    env_paths=env_paths,
    env=env,
    checks=checks,
    warnings=warnings,
    rules=RULES,
)
