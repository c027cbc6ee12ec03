"""The Slurm of the tests is a real cluster engine: it spreads jobs over its three nodes, a
higher partition requeues a lower one's jobs, a job above its memory is killed, GPUs are
counted and handed out, a node set DOWN requeues its jobs, and stopping it leaves no process."""

from __future__ import annotations

import re
from pathlib import Path

from slurm_cluster import SlurmCluster, poll_until, start_slurm_cluster


def submit(
    cluster: SlurmCluster, *options: str, wrap: str, partition: str = "simrun-standard-base"
) -> str:
    """Submit a batch job of `wrap`; its id."""
    command = ["sbatch", "--parsable", f"--partition={partition}", *options, f"--wrap={wrap}"]
    out = cluster.run(*command).stdout
    return out.strip().split(";")[0]


def node_filling_sleeper(cluster: SlurmCluster, partition: str = "simrun-standard-base") -> str:
    """Submit a job that may be requeued and holds a node's two CPUs for two minutes; its id."""
    return submit(
        cluster,
        "--requeue",
        "--cpus-per-task=2",
        "--mem=100",
        "--output=/dev/null",
        wrap="sleep 120",
        partition=partition,
    )


def job(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    """The fields of `scontrol show job` (kept for MinJobAge after the job ended)."""
    out = cluster.run("scontrol", "show", "job", "--oneliner", job_id).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def test_jobs_spread_over_the_three_nodes_and_are_recorded_by_name(idle_slurm, tmp_path):
    ids = [
        submit(
            idle_slurm,
            f"--job-name=simrun-test-{index}",
            "--cpus-per-task=2",
            "--mem=100",
            f"--output={tmp_path}/%j.out",
            wrap="echo $SLURMD_NODENAME; sleep 2",
        )
        for index in range(3)
    ]
    poll_until(
        lambda: all(job(idle_slurm, i)["JobState"] == "COMPLETED" for i in ids),
        what="the three jobs to complete",
    )
    nodes = {(tmp_path / f"{i}.out").read_text().strip() for i in ids}
    assert nodes == {"node1", "node2", "node3"}
    records = idle_slurm.jobcomp.read_text()
    for index, job_id in enumerate(ids):
        assert f"JobId={job_id} " in records and f"Name=simrun-test-{index} " in records


def test_a_higher_partition_requeues_a_lower_ones_job(idle_slurm):
    low = [node_filling_sleeper(idle_slurm, partition="simrun-agent-extra") for _ in range(3)]
    poll_until(lambda: all(job(idle_slurm, i)["JobState"] == "RUNNING" for i in low))
    high = submit(
        idle_slurm,
        "--cpus-per-task=2",
        "--mem=100",
        "--output=/dev/null",
        wrap="sleep 1",
        partition="simrun-owner-base",
    )
    poll_until(lambda: job(idle_slurm, high)["JobState"] in {"RUNNING", "COMPLETED"})
    requeued = [i for i in low if job(idle_slurm, i)["Restarts"] != "0"]
    assert len(requeued) == 1, [job(idle_slurm, i) for i in low]
    assert job(idle_slurm, requeued[0])["JobState"] in {"PENDING", "REQUEUED", "PREEMPTED"}


def test_a_job_above_its_memory_is_killed(idle_slurm, tmp_path):
    job_id = submit(
        idle_slurm,
        "--mem=100",
        f"--output={tmp_path}/out",
        wrap="python3 -c 'import time; a = bytearray(400 * 2**20); time.sleep(30)'",
    )
    poll_until(lambda: job(idle_slurm, job_id)["JobState"] not in {"PENDING", "RUNNING"})
    assert job(idle_slurm, job_id)["JobState"] in {"FAILED", "OUT_OF_MEMORY", "CANCELLED"}
    assert "Exceeded job memory limit" in (tmp_path / "out").read_text()


def test_gpus_are_counted_and_handed_out(idle_slurm, tmp_path):
    gres = idle_slurm.run("sinfo", "--noheader", "--Node", "--format=%N %G").stdout
    assert all(line.split()[1] == "gpu:2" for line in gres.splitlines()), gres
    job_id = submit(
        idle_slurm,
        "--gres=gpu:1",
        "--mem=50",
        f"--output={tmp_path}/out",
        wrap="echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES",
    )
    poll_until(lambda: job(idle_slurm, job_id)["JobState"] == "COMPLETED")
    assert re.fullmatch(r"CUDA_VISIBLE_DEVICES=[01]\n", (tmp_path / "out").read_text())
    refused = idle_slurm.run(
        "sbatch", "--partition=simrun-standard-base", "--gres=gpu:3", "--wrap=true", check=False
    )
    assert refused.returncode != 0
    assert "Requested node configuration is not available" in refused.stderr


def running_on(cluster: SlurmCluster, job_id: str) -> str:
    """The node the job runs on, "" while it does not run."""
    fields = job(cluster, job_id)
    return fields["NodeList"] if fields["JobState"] == "RUNNING" else ""


def test_a_node_set_down_requeues_its_jobs(idle_slurm):
    job_id = node_filling_sleeper(idle_slurm)
    node = poll_until(lambda: running_on(idle_slurm, job_id), what="the job to run")
    try:
        idle_slurm.run("scontrol", "update", f"nodename={node}", "state=down", "reason=test")
        poll_until(lambda: job(idle_slurm, job_id)["Restarts"] != "0", what="the requeue")
        poll_until(
            lambda: running_on(idle_slurm, job_id) not in {"", node},
            what="the job to run again on another node",
        )
    finally:
        idle_slurm.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)


def test_stopping_the_cluster_ends_every_daemon_and_job_process(tmp_path):
    # Nodes of other names than the cluster of the other tests: two slurmd of one node name on
    # one host break each other's job launches.
    cluster = start_slurm_cluster(tmp_path / "slurm", nodes=1, gpus=0, node_prefix="solo")
    marker = tmp_path / "marker"
    try:
        job_id = submit(
            cluster, "--mem=50", "--output=/dev/null", wrap=f"echo $$ > {marker}; sleep 300"
        )

        def started() -> str:
            # On a loaded machine slurmd may give up on a slow slurmstepd and Slurm holds the
            # job ("launch failed requeued held"); what this test checks begins once it runs.
            if "launch failed" in job(cluster, job_id).get("Reason", "").lower().replace("_", " "):
                cluster.run("scontrol", "release", job_id, check=False)
            return marker.exists() and marker.read_text().strip()

        try:
            started_pid = poll_until(started, 120)
        except TimeoutError:
            raise AssertionError(
                f"the job did not start: {cluster.queue()}\n{cluster.log_tail()}"
            ) from None
        pid = int(started_pid)
        assert Path(f"/proc/{pid}").exists()
    finally:
        cluster.stop()
    assert cluster.keeper.returncode == 0
    assert not Path(f"/proc/{pid}").exists()
    daemons = [p for p in ("slurmctld.pid", "slurmd-solo1.pid") if (cluster.root / p).exists()]
    for pidfile in daemons:
        text = (cluster.root / pidfile).read_text().strip()
        assert not text or not Path(f"/proc/{text}").exists() or _zombie(int(text))


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
