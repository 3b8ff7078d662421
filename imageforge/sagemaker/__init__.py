"""The SageMaker emulator (`invoke run-local`): a training job run with Docker on this machine.

Each host is one container of the image, started the way SageMaker starts it
(`docker run IMAGE train`) with the /opt/ml layout the SageMaker training toolkit reads
(sagemaker-training 5.1.4, environment.py): input/config/{hyperparameters,resourceconfig,
inputdataconfig}.json, input/data/<channel>, code, model, output. Hosts are named algo-1 ..
algo-N and reach each other on a private network made for the job. Whatever happens (success,
a failed host, the time limit, Ctrl-C, SIGTERM) the job's containers and network are removed;
its files stay in the output directory: <output>/<host>/{input/config,model,output,log.txt}
and the job's SSH key pair in <output>/ssh.
"""

from imageforge.sagemaker.contract import (
    HostResult,
    JobResult,
    JobSpec,
    failure_reason,
    host_names,
    hyperparameters_json,
    input_data_config,
    make_spec,
    mount_value,
    mounts,
    new_job_name,
    parse_channels,
    parse_hyperparameters,
    resource_config,
    write_layout,
)
from imageforge.sagemaker.job import require_success, run, summary

__all__ = ["HostResult", "JobResult", "JobSpec", "failure_reason", "host_names",
           "hyperparameters_json", "input_data_config", "make_spec", "mount_value", "mounts",
           "new_job_name", "parse_channels", "parse_hyperparameters", "require_success",
           "resource_config", "run", "summary", "write_layout"]
