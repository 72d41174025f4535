"""examples/kubernetes/ as far as a machine with no cluster can take it.

- Every manifest is validated against Kubernetes' own OpenAPI schemas
  (kubernetes-validate, from PyPI; strict: an unknown field is an error)
  for 1.31, where everything they use is GA (podFailurePolicy), and for the
  newest version the validator knows.
- What the schemas cannot see is checked: the Job, its Service, the grace
  period and relaunch's flags agree with each other.
- Their commands run: a Job pod's `relaunch run --print-config` with the
  environment and /etc/hosts the kubelet gives pod 1, and the tracking
  server's Deployment command, probed as the kubelet probes it and stopped
  as the kubelet stops it.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "kubernetes"
TRAIN = EXAMPLES / "train.yaml"
SERVER = EXAMPLES / "server.yaml"
SCALE = EXAMPLES / "server-scale.yaml"
RELAUNCH = [sys.executable, "-m", "relaunch"]
VERSIONS = ["1.31.0", kubernetes_validate.utils.latest_version()]


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kind(path: Path, name: str) -> dict:
    (doc,) = [d for d in docs(path) if d["kind"] == name]
    return doc


def flag(command: list[str], name: str) -> str:
    (value,) = [arg.split("=", 1)[1] for arg in command if arg.startswith(f"{name}=")]
    return value


def test_the_examples_are_all_here():
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == [
        "server-scale.yaml", "server.yaml", "train.yaml",
    ]  # fmt: skip


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", [TRAIN, SERVER, SCALE], ids=lambda p: p.name)
def test_every_manifest_is_valid_kubernetes(path, version):
    kinds = []
    for doc in docs(path):
        kubernetes_validate.validate(doc, version, strict=True)
        kinds.append(doc["kind"])
    assert kinds, path


def test_the_validator_rejects_what_a_cluster_would():
    """The check above can fail: a misspelt field, a wrong type and a pod
    condition rule without its status are each refused."""
    job = kind(TRAIN, "Job")
    misspelt = copy.deepcopy(job)
    misspelt["spec"]["template"]["spec"]["terminationGracePeriodSecond"] = 180
    wrong_type = copy.deepcopy(job)
    wrong_type["spec"]["completions"] = "two"
    no_status = copy.deepcopy(job)
    for rule in no_status["spec"]["podFailurePolicy"]["rules"]:
        for condition in rule.get("onPodConditions", []):
            del condition["status"]
    for broken, why in [
        (misspelt, "'terminationGracePeriodSecond' was unexpected"),
        (wrong_type, "'two' is not of type 'integer'"),
        (no_status, "'status' is a required property"),
    ]:
        with pytest.raises(kubernetes_validate.ValidationError, match=re.escape(why)):
            kubernetes_validate.validate(broken, VERSIONS[0], strict=True)


def test_the_job_its_service_and_relaunchs_flags_agree():
    service, job = kind(TRAIN, "Service"), kind(TRAIN, "Job")
    spec = job["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    command = container["command"]
    assert command[:2] == ["relaunch", "run"]
    # One pod per node, as many as relaunch waits for.
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == int(flag(command, "--nnodes"))
    # The pods resolve as JOB-INDEX.SERVICE while they start.
    assert pod["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": job["metadata"]["name"]}
    assert [p["port"] for p in service["spec"]["ports"]] == [29500]
    assert [p["containerPort"] for p in container["ports"]] == [29500]
    # A stop (exit 75) and a disruption are retried without counting.
    assert pod["restartPolicy"] == "Never"
    rules = spec["podFailurePolicy"]["rules"]
    assert {
        "action": "Ignore",
        "onExitCodes": {"containerName": container["name"], "operator": "In", "values": [75]},
    } in rules
    disruption = {"type": "DisruptionTarget", "status": "True"}
    assert {"action": "Ignore", "onPodConditions": [disruption]} in rules
    # relaunch stops its ranks, then itself, inside the grace period, and
    # `relaunch doctor` is told the grace period.
    grace = pod["terminationGracePeriodSeconds"]
    assert float(flag(command, "--shutdown-timeout")) < grace
    env = {e["name"]: e for e in container["env"]}
    assert env["RELAUNCH_GRACE_PERIOD"]["value"] == str(grace)
    # The claims are in the file; the tracking server is server.yaml's Service.
    claims = {v["persistentVolumeClaim"]["claimName"]
              for v in pod["volumes"] if "persistentVolumeClaim" in v}  # fmt: skip
    assert claims == {d["metadata"]["name"] for d in docs(TRAIN)
                      if d["kind"] == "PersistentVolumeClaim"}  # fmt: skip
    for server_file in (SERVER, SCALE):
        server = kind(server_file, "Service")
        (port,) = server["spec"]["ports"]
        assert (
            env["RELAUNCH_SERVER"]["value"] == f"http://{server['metadata']['name']}:{port['port']}"
        )


def test_the_job_fails_at_once_on_what_a_retry_cannot_fix():
    """The FailJob rule's exit code is what relaunch gives a bad flag."""
    job = kind(TRAIN, "Job")
    rules = job["spec"]["podFailurePolicy"]["rules"]
    (fail,) = [r for r in rules if r["action"] == "FailJob"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    bad = [*RELAUNCH, *container["command"][1:2], "--nnodes=two", "x.py"]
    out = subprocess.run(bad, capture_output=True, text=True, timeout=60)
    assert out.returncode in fail["onExitCodes"]["values"], out.stderr
    assert "--nnodes" in out.stderr, out.stderr


def test_a_pod_of_the_job_resolves_its_rank_store_and_run_from_kubernetes(tmp_path):
    """Pod 1 of the Job, as the kubelet makes it: HOSTNAME=train-1,
    JOB_COMPLETION_INDEX=1, and /etc/hosts naming the pod in the Service
    (bind-mounted in a mount namespace of its own). The manifest's own
    flags, and nothing else, give the rest."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        why = "needs root and util-linux's unshare to give the pod its /etc/hosts"
        if os.environ.get("CI"):
            pytest.fail(f"CI runs as root: {why}")
        pytest.skip(why)
    job = kind(TRAIN, "Job")
    name = job["metadata"]["name"]
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    command = container["command"]
    script = next(i for i, arg in enumerate(command[2:], 2) if not arg.startswith("-"))
    hosts = tmp_path / "hosts"
    hosts.write_text(
        "127.0.0.1 localhost\n"
        f"10.1.2.3 {name}-1.{pod['subdomain']}.team.svc.cluster.local {name}-1\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RELAUNCH_", "PET_"))}
    env.update({e["name"]: e["value"] for e in container["env"] if "value" in e})
    env.update(HOSTNAME=f"{name}-1", JOB_COMPLETION_INDEX="1")
    out = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts),
         *RELAUNCH, "run", *command[2:script], "--print-config", *command[script:]],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    settings = {
        line.split()[0]: line.split("<-")[0].split()[1:] for line in out.stdout.splitlines()[1:]
    }
    assert "inside Kubernetes" in out.stdout.splitlines()[0], out.stdout
    assert settings["node_rank"] == ["1"], out.stdout
    assert settings["nnodes"] == [str(job["spec"]["completions"])], out.stdout
    assert settings["master_addr"] == [f"{name}-0.{pod['subdomain']}"], out.stdout
    assert settings["master_port"] == ["29500"], out.stdout
    assert settings["run_id"] == [f"k8s-{name}"], out.stdout
    assert "$JOB_COMPLETION_INDEX" in out.stdout and "/etc/hosts" in out.stdout


def kubelet_command(container: dict, env: dict[str, str]) -> list[str]:
    """The container's command as the kubelet runs it: $(VAR) from its env."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg) for arg in container["command"]]


def probe(url: str, token: str | None = None) -> int:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def test_the_tracking_servers_command_serves_its_probes_and_stops_in_its_grace_period(
    tmp_path, free_port
):
    """server.yaml's container command, run as the kubelet would (the token
    from the Secret through $(RELAUNCH_SERVER_TOKEN)); only the address is
    loopback and the data directory a temporary one. The readiness and
    liveness probes' path answers without the token, the API needs it, and
    SIGTERM ends the server well inside terminationGracePeriodSeconds."""
    deployment = kind(SERVER, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    token = "k8s-example-token"
    command = kubelet_command(container, {"RELAUNCH_SERVER_TOKEN": token})
    assert command[:2] == ["relaunch", "server"]
    assert f"--token={token}" in command
    mount = container["volumeMounts"][0]["mountPath"]
    assert flag(command, "--data-dir") == mount
    replaced = {"--host": "127.0.0.1", "--port": str(free_port), "--data-dir": str(tmp_path)}
    args = [f"{a.split('=')[0]}={replaced[a.split('=')[0]]}" if a.split("=")[0] in replaced else a
            for a in command[2:]]  # fmt: skip
    (port,) = container["ports"]
    assert port["containerPort"] == int(flag(command, "--port"))
    proc = subprocess.Popen([*RELAUNCH, "server", *args], stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{free_port}"
        for name in ("readinessProbe", "livenessProbe"):
            path = container[name]["httpGet"]["path"]
            assert container[name]["httpGet"]["port"] == port["name"]
            wait_for(lambda p=path: probe(base + p) == 200, 30, f"the {name} to pass")
        assert probe(f"{base}/api/v1/runs") == 401
        assert probe(f"{base}/api/v1/runs", token) == 200
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=pod["terminationGracePeriodSeconds"])
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate(timeout=30)
    assert code == 0, err
    assert took < pod["terminationGracePeriodSeconds"], took
    assert token not in err, err


def test_the_scaled_servers_command_names_what_it_cannot_reach(tmp_path, free_port):
    """server-scale.yaml's command, with the Secret's values, where neither
    its bucket nor its database can be reached (AWS_ENDPOINT_URL and the
    database on loopback ports nothing listens on): it refuses to start
    with one line naming the flag to fix, and no password or key appears."""
    deployment = kind(SCALE, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    secrets = {
        "RELAUNCH_SERVER_TOKEN": "tok-123456",
        "PGPASSWORD": "pg-secret-987",
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "aws-secret-654",
    }
    assert {e["name"] for e in container["env"] if "valueFrom" in e} == set(secrets)
    command = kubelet_command(container, secrets)
    database = flag(command, "--database")
    # The manifest's database host, on a port nothing listens on here.
    unreachable = re.sub(r"@[^/]+/", "@127.0.0.1:1/", database)
    replaced = {"--host": "127.0.0.1", "--port": str(free_port), "--data-dir": str(tmp_path),
                "--database": unreachable}  # fmt: skip
    args = [f"{a.split('=')[0]}={replaced[a.split('=')[0]]}" if a.split("=")[0] in replaced else a
            for a in command[2:]]  # fmt: skip
    env = {**os.environ, **secrets, "AWS_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": "http://127.0.0.1:1"}  # fmt: skip
    out = subprocess.run([*RELAUNCH, "server", *args], capture_output=True, text=True,
                         timeout=120, env=env)  # fmt: skip
    assert out.returncode == 1, out.stderr
    (error,) = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert error.startswith(f"error: --blobs {flag(command, '--blobs')}: cannot reach"), error
    assert "check --s3-endpoint (or AWS_ENDPOINT_URL)" in error, error
    for secret in secrets.values():
        assert secret not in out.stderr + out.stdout
