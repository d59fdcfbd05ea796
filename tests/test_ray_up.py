"""`ray up` for real on this machine (issue 13, item 1): cluster-local.yaml brought up with
Ray's own CLI, a user's driver script submitted as a Ray job, the job and the search's
trials found through the dashboard's HTTP API, and `ray down`.

The cluster is two "nodes" (127.0.0.5 and 127.0.0.6) that Ray's on-prem `local` provider
reaches over SSH. Everything it needs the setup below provides and the teardown removes:
openssh-server and rsync (from Debian, when missing), an sshd of its own listening on
those two addresses only, a key pair, and a user of its own that runs the cluster, so
the `ray stop` that `ray up` and `ray down` run on the head can signal this cluster's
processes and no one else's. Slow (a few minutes): marked `ray_up` as well as `ray`.
"""

import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from process_tree import kill_trees
from ray_budget import record_elsewhere

pytestmark = [pytest.mark.ray, pytest.mark.ray_up, pytest.mark.own_ray]

ROOT = Path(__file__).parents[1]
CONFIG = yaml.safe_load((ROOT / "cluster-local.yaml").read_text())
DRIVER = ROOT / "examples" / "cluster_driver.py"
HEAD, WORKER = CONFIG["provider"]["head_ip"], CONFIG["provider"]["worker_ips"][0]
DASHBOARD = f"http://{HEAD}:8266"  # --dashboard-port of head_start_ray_commands
PACKAGES = ("openssh-server", "rsync")
JOB_POLL_S = 5


def _run(*command: str, **kwargs) -> subprocess.CompletedProcess:
    completed = subprocess.run(command, capture_output=True, text=True, **kwargs)
    assert completed.returncode == 0, f"{command}: {completed.stdout[-2000:]}{completed.stderr[-2000:]}"
    return completed


def _installed(package: str) -> bool:
    status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package],
                            capture_output=True, text=True).stdout
    return status.endswith("installed") and "not-installed" not in status


def _install(packages) -> list[str]:
    """apt-get install what is missing, with services kept from starting; returns the
    packages that were added (dependencies too), for the teardown to purge."""
    missing = [p for p in packages if not _installed(p)]
    if not missing:
        return []
    before = set(_run("dpkg-query", "-W", "-f=${Package}\n").stdout.split())
    policy = Path("/usr/sbin/policy-rc.d")
    own_policy = not policy.exists()
    if own_policy:  # no service may start (the system sshd would listen on every interface)
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        _run("apt-get", "update", "-qq", env=env)
        _run("apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing, env=env)
    finally:
        if own_policy:
            policy.unlink()
    return sorted(set(_run("dpkg-query", "-W", "-f=${Package}\n").stdout.split()) - before)


def _user_processes(uid: int) -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir()
            if p.name.isdigit() and _owner(p) == uid]


def _owner(path: Path) -> int | None:
    try:
        return path.stat().st_uid
    except OSError:
        return None


def _user_environment(venv: Path) -> Path:
    """A Python environment the cluster's user can run: this checkout's venv links to a
    Python under /root, which no other user may enter, so the system Python (same minor
    version) gets a venv whose site dir adds this checkout's packages, and a `ray`."""
    system_python = Path("/usr/bin/python3")
    version = _run(str(system_python), "-c", "import sys; print(sys.version_info[:2])").stdout
    assert version.strip() == str(tuple(sys.version_info[:2])), "system Python differs"
    _run(str(system_python), "-m", "venv", "--without-pip", str(venv))
    site_dir = Path(_run(str(venv / "bin" / "python"), "-c",
                         "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    (site_dir / "tula_ray_checkout.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    ray_cli = venv / "bin" / "ray"
    ray_cli.write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\n"
                       "from ray.scripts.scripts import main\nsys.exit(main())\n")
    ray_cli.chmod(0o755)
    return venv


@pytest.fixture(scope="module")
def sandbox(no_shared_ray):
    """SSH server, key, and a user of its own; everything removed afterwards."""
    scratch = Path(tempfile.mkdtemp(prefix="tula-up-"))
    scratch.chmod(0o755)
    user = f"tulaup{secrets.token_hex(3)}"
    added, sshd, uid, own_run_dir = [], None, None, False
    try:
        added = _install(PACKAGES)
        home = scratch / "home"
        _run("useradd", "--create-home", "--home-dir", str(home), "--shell", "/bin/bash", user)
        _run("usermod", "--password", "*", user)  # no password, but not a locked account
        uid = pwd.getpwnam(user).pw_uid
        for name in ("ray-tmp", "runs"):
            (scratch / name).mkdir()
            shutil.chown(scratch / name, user)
        venv = _user_environment(scratch / "venv")
        (home / ".bashrc").write_text(
            f"export PATH={venv / 'bin'}:$PATH\n"
            f"export RAY_TMPDIR={scratch / 'ray-tmp'}\n"
            "export RAY_TRAIN_ENABLE_PREEMPTION_WATCHER=0\n")
        key = scratch / "id_ed25519"
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(scratch / "host_key"))
        shutil.copy(key.with_suffix(".pub"), scratch / "authorized_keys")
        (scratch / "sshd_config").write_text(
            f"Port 22\nListenAddress {HEAD}\nListenAddress {WORKER}\n"
            f"HostKey {scratch / 'host_key'}\nPidFile {scratch / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {scratch / 'authorized_keys'}\nAllowUsers {user}\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
            "StrictModes no\nPermitRootLogin no\n")
        own_run_dir = not Path("/run/sshd").exists()  # sshd's privilege separation dir
        Path("/run/sshd").mkdir(exist_ok=True)
        sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(scratch / "sshd_config")],
                                stdout=open(scratch / "sshd.log", "w"), stderr=subprocess.STDOUT)
        yield {"scratch": scratch, "user": user, "key": key}
    finally:
        if sshd is not None:
            sshd.send_signal(signal.SIGTERM)
            sshd.wait()
        record_elsewhere(scratch / "ray-tmp" / "ray", "the `ray up` cluster")
        if uid is not None:  # whatever the cluster's user still runs: this test's processes
            kill_trees(_user_processes(uid), grace_s=5)
            subprocess.run(["userdel", "--remove", user], capture_output=True)
        if own_run_dir:
            shutil.rmtree("/run/sshd", ignore_errors=True)
        if added:
            subprocess.run(["apt-get", "purge", "-y", "-qq", *added], capture_output=True,
                           env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(sandbox):
    """cluster-local.yaml with this test's user, key and cluster name, up with `ray up`."""
    scratch = sandbox["scratch"]
    config = {**CONFIG, "cluster_name": f"tula-ray-test-{sandbox['user']}",
              "auth": {"ssh_user": sandbox["user"], "ssh_private_key": str(sandbox["key"])}}
    path = scratch / "cluster.yaml"
    path.write_text(yaml.safe_dump(config))
    (scratch / "launcher").mkdir()
    # The launcher's own files (the local provider's state) in the scratch dir, not /tmp/ray.
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = str(scratch / "launcher")
    env["RAY_UP_enable_autoscaler_v2"] = "0"  # v2 never launches a `local` worker (cluster-local.yaml)
    ray_cli = str(Path(sys.executable).with_name("ray"))
    try:
        _run(ray_cli, "up", "-y", "--no-config-cache", str(path), env=env)
        yield {**sandbox, "config": path}
    finally:
        # On the head `ray down` runs `ray stop` as the cluster's user: only its processes.
        subprocess.run([ray_cli, "down", "-y", str(path)], env=env, capture_output=True)


def _get(path: str):
    with urllib.request.urlopen(f"{DASHBOARD}{path}", timeout=30) as response:
        return json.load(response)


@pytest.fixture(scope="module")
def job(cluster):
    """The user's driver script, submitted as a Ray job; its final state."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(DASHBOARD)
    scratch = cluster["scratch"]
    # As README shows for this cluster: the script by its path (both nodes are this machine;
    # with --working-dir the job's directory vanished under it here, see cluster-local.yaml).
    job_id = client.submit_job(entrypoint=(
        f"python {DRIVER} --storage-path {scratch / 'runs'} --name ray-up "
        f"--out {scratch / 'runs' / 'plan'}"))
    while (status := client.get_job_status(job_id)) not in (
            JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
        time.sleep(JOB_POLL_S)
    logs = client.get_job_logs(job_id)
    assert status == JobStatus.SUCCEEDED, logs[-3000:]
    return {"id": job_id, "logs": logs, "plan": scratch / "runs" / "plan" / "plan.json"}


def test_the_submitted_driver_searched_on_both_nodes(job):
    assert job["plan"].is_file()
    plan = json.loads(job["plan"].read_text())
    assert plan["workload"] == "tiny-mlp"
    nodes = _get("/api/v0/nodes")["data"]["result"]["result"]  # Ray's state API
    assert sorted(node["node_ip"] for node in nodes if node["state"] == "ALIVE") == sorted(
        [HEAD, WORKER])


def test_the_dashboard_lists_the_job_and_the_search_trials(job):
    jobs = {entry["submission_id"]: entry for entry in _get("/api/jobs/")}
    assert jobs[job["id"]]["status"] == "SUCCEEDED"
    assert DRIVER.name in jobs[job["id"]]["entrypoint"]
    runs = _get("/api/train/v2/runs/v1")["train_runs"]
    # One Ray Train run per profiled candidate (trainables/profiling_trial.py names them).
    assert "profile-N2-B32" in {run["name"] for run in runs}
    assert all(run["job_id"] for run in runs)
