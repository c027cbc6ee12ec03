"""The pure Slurm core: job names, the batch script, the state table and the parsers, on
outputs recorded from the real Slurm 22.05 of the tests (tests/core/slurm_outputs/)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from simrun_core import exits, slurm
from simrun_core.launch import Launch
from simrun_core.planner import PodShape, TaskPlan
from simrun_core.slurm_jobs import SlurmSettings

OUTPUTS = Path(__file__).with_name("slurm_outputs")
RUN = "20261204-205011-abcdef"


def plan(task: str, units: int | None, pods: int = 1) -> TaskPlan:
    shape = PodShape(
        cores=2,
        memory_gb=1,
        processes=2,
        per_worker_gb=0.25,
        retry_memory_gb=2,
        retry_per_worker_gb=0.5,
    )
    return TaskPlan(
        task_id=task,
        pods=pods,
        shape=shape,
        base_priority="simrun-agent-base",
        extra_priority="simrun-agent-extra",
        units=units,
    )


def queue(name: str) -> dict[str, slurm.JobStatus]:
    jobs = slurm.parse_queue((OUTPUTS / name).read_text())
    return {job.job_id: job for job in jobs}


def test_a_job_name_holds_the_run_and_parses_back_with_dashed_task_ids():
    plans = {
        "lost": plan("lost", None),
        "lost-split": plan("lost-split", 100, pods=3),
        "a-w1": plan("a-w1", None),
    }
    for task, worker in [("lost", "lost"), ("lost-split", "w2"), ("a-w1", "a-w1")]:
        name = slurm.job_name(RUN, task, worker)
        assert name == f"simrun-{RUN}-{task}-{worker}"
        assert slurm.run_of_job(name) == RUN
        assert slurm.pod_of_job(name, plans) == (RUN, task, worker)
    assert slurm.pod_of_job(slurm.job_name(RUN, "lost-split", "w3"), plans) is None
    assert slurm.run_of_job("simrun-x-a-b-w0") is None


def test_the_queue_of_a_real_slurm_is_read_with_exit_codes_restarts_and_comments():
    jobs = queue("squeue_requeued.txt")
    assert "1" not in jobs and "2" not in jobs  # jobs of other names are left out
    requeued = jobs["30"]
    assert (requeued.state, requeued.restarts, requeued.attempt) == ("PENDING", 1, 1)
    assert requeued.fact == "pending" and requeued.node is None
    failed = jobs["5"]
    assert (failed.fact, failed.exit_code, failed.first_attempt) == ("failed", 3, 2)
    killed = jobs["7"]
    assert (killed.fact, killed.exit_code) == ("failed", 137)
    assert jobs["33"].fact == "running" and jobs["33"].node == "node3"
    assert jobs["8"].state == "CANCELLED" and jobs["8"].exit_code == 0  # never ran again
    down = queue("squeue_node_down.txt")
    assert down["35"].fact == "lost"
    assert down["36"].fact == "pending" and down["36"].restarts == 1


def test_a_line_of_another_shape_is_refused_naming_it():
    with pytest.raises(slurm.SlurmOutputError, match="line 1 has 2 fields"):
        slurm.parse_queue("1\x1fsimrun-x\x1f\n")


def test_scontrol_jobs_read_the_same_as_squeue():
    jobs = [
        slurm.job_from_scontrol(f)
        for f in slurm.parse_oneliner((OUTPUTS / "scontrol_jobs_ended.txt").read_text())
    ]
    by_id = {job.job_id: job for job in jobs}
    assert by_id["26"].fact == "succeeded" and by_id["26"].exit_code == 0
    assert by_id["27"].exit_code == 3 and by_id["27"].first_attempt == 2
    assert by_id["29"].exit_code == 137
    assert by_id["34"].exit_code == 143 and by_id["34"].state == "CANCELLED"
    assert by_id["35"].fact == "lost"


def test_a_memory_kill_is_told_by_slurmstepds_line():
    killed = queue("squeue_requeued.txt")["7"]
    assert slurm.is_memory_kill(killed, "slurmstepd-node2: error: Exceeded job memory limit\n")
    assert not slurm.is_memory_kill(killed, "")
    assert not slurm.is_memory_kill(queue("squeue_requeued.txt")["5"], slurm.MEMORY_KILL_TEXT)


def test_a_requeue_ends_the_attempt_preempted_and_the_next_one_waits():
    job = queue("squeue_requeued.txt")["30"]
    changes = slurm.attempt_changes((0, "running"), job)
    assert [(c.attempt, c.phase) for c in changes] == [(0, "preempted"), (1, "pending")]
    assert slurm.attempt_changes((1, "pending"), job) == []
    cancelled = queue("squeue_requeued.txt")["8"]  # cancelled while it waited again
    assert [
        (c.attempt, c.phase, c.exit_code) for c in slurm.attempt_changes((1, "pending"), cancelled)
    ] == [(1, "failed", 143)]


def test_an_ended_job_seen_first_fills_in_that_it_ran_and_is_never_reported_again():
    job = queue("squeue_requeued.txt")["5"]
    changes = slurm.attempt_changes(None, job)
    assert [(c.attempt, c.phase, c.exit_code) for c in changes] == [
        (2, "pending", None),
        (2, "running", None),
        (2, "failed", 3),
    ]
    assert slurm.attempt_changes((2, "failed"), job) == []
    lost = queue("squeue_node_down.txt")["35"]
    assert [c.phase for c in slurm.attempt_changes((0, "running"), lost)] == ["preempted"]
    memory = slurm.attempt_changes((0, "running"), queue("squeue_requeued.txt")["7"])
    assert memory[-1].memory_suspect and memory[-1].exit_code == 137


def test_a_job_slurm_held_after_its_launch_failed_ends_the_attempt_as_a_stop():
    # Recorded on the tests' cluster: w1's node's prolog failed (slurmd requeued it held),
    # w2 was submitted --hold (a person's hold: it waits for them).
    jobs = queue("squeue_launch_failed_held.txt")
    held, user_held = jobs["34844000"], jobs["34844001"]
    assert (held.state, held.reason, held.restarts, held.attempt) == (
        "PENDING",
        "launch failed requeued held",
        1,
        1,
    )
    assert held.held_after_failure and list(held.covered_attempts) == [0]
    changes = slurm.attempt_changes((0, "pending"), held)
    assert [(c.attempt, c.phase, c.exit_code) for c in changes] == [(0, "failed", 143)]
    assert changes[0].message is not None and "launch failed requeued held" in changes[0].message
    assert exits.stopped_from_outside(changes[0].exit_code or 0)
    first_seen = slurm.attempt_changes(None, held)
    assert [(c.attempt, c.phase) for c in first_seen] == [(0, "pending"), (0, "failed")]
    assert slurm.attempt_changes((0, "failed"), held) == []
    assert slurm.attempt_changes((1, "failed"), held) == []  # its next attempt: never reported
    assert not user_held.held_after_failure and list(user_held.covered_attempts) == [0]
    assert slurm.attempt_changes((0, "pending"), user_held) == []
    cancelled = queue("squeue_launch_failed_cancelled.txt")["34844000"]  # simrun's scancel
    assert not cancelled.held_after_failure
    assert slurm.attempt_changes((1, "failed"), cancelled) == []


def test_kill_wait_is_read_from_scontrol_show_config_and_bounds_the_grace():
    config = (OUTPUTS / "scontrol_show_config.txt").read_text()
    assert slurm.config_seconds(config, "KillWait") == 5
    assert slurm.config_seconds(config, "NoSuchKey") is None
    assert slurm.config_seconds("KillWait = UNLIMITED\n", "KillWait") is None
    assert slurm.grace_problem(5, 5) is None and slurm.grace_problem(0.5, 5) is None
    assert slurm.grace_problem(30, 5) == (
        "slurm.grace_s is 30 s, more than this Slurm's KillWait of 5 s (the seconds a job has "
        "after SIGTERM before SIGKILL): set slurm.grace_s to 5 or less, or raise KillWait in "
        "slurm.conf"
    )


def test_sbatch_options_may_not_replace_the_name_or_comment_simrun_follows_jobs_by():
    options = ["--constraint=avx2", "--comment=lab-7", "-Jmine", "--job-name=x"]
    with pytest.raises(msgspec.ValidationError) as refused:
        msgspec.convert({"sbatch_options": options}, SlurmSettings)
    assert str(refused.value).startswith(
        "sbatch_options[1] '--comment=lab-7', sbatch_options[2] '-Jmine', "
        "sbatch_options[3] '--job-name=x': simrun sets each job's name and comment itself"
    )
    assert msgspec.convert({"sbatch_options": options[:1]}, SlurmSettings).sbatch_options == [
        "--constraint=avx2"
    ]


def test_host_lists_expand_to_their_nodes():
    assert slurm.expand_hostlist("node1") == ["node1"]
    assert slurm.expand_hostlist("node[1-2]") == ["node1", "node2"]
    assert slurm.expand_hostlist("node[1-3,7],gpu01") == [
        "node1",
        "node2",
        "node3",
        "node7",
        "gpu01",
    ]
    assert slurm.expand_hostlist("n[08-10]") == ["n08", "n09", "n10"]
    assert slurm.expand_hostlist("rack[1-2]-n[01-02]") == [
        "rack1-n01",
        "rack1-n02",
        "rack2-n01",
        "rack2-n02",
    ]
    assert slurm.expand_hostlist("") == [] and slurm.expand_hostlist("(null)") == []


def test_nodes_with_their_gpus_from_scontrol():
    nodes = slurm.nodes_of_scontrol(
        (OUTPUTS / "scontrol_node.txt").read_text(), ["simrun-owner-base"]
    )
    assert [(n.name, n.cpus, n.memory_mb, n.gpus) for n in nodes] == [
        (f"node{i}", 2, 2000, 2) for i in (1, 2, 3)
    ]
    assert slurm.nodes_of_scontrol((OUTPUTS / "scontrol_node.txt").read_text(), ["other"]) == []
    assert slurm.gpus_of_gres("gpu:a100:4(S:0),shard:8") == 4
    assert slurm.gpus_of_gres("(null)") == 0


def test_the_batch_script_asks_what_the_plan_gives_and_computes_the_attempt():
    launch = Launch(
        task_dir=f"/store/runs/{RUN}/tasks/fit",
        task_type="demo.squares",
        worker="w1",
        node="",
        entry="worker",
        attempt=2,
        role="extra",
        memory_limit_gb=1.0,
        memory_enforced=True,
    )
    job = slurm.BatchJob(
        launch=launch,
        argv=["/venv/bin/python", "-m", "simrun_harness.worker"],
        partition="simrun-agent-extra",
        cores=2,
        memory_mb=1024,
        gpus=1,
        requeue=True,
        log_dir=f"/store/runs/{RUN}/tasks/fit/logs",
        scratch_root="/tmp/simrun",
        account="lab",
        reservation=f"simrun-{RUN}",
        options=("--constraint=fast",),
    )
    script = slurm.batch_script(job)
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    for option in [
        f"--job-name=simrun-{RUN}-fit-w1",
        "--partition=simrun-agent-extra",
        "--cpus-per-task=2",
        "--mem=1024M",
        "--gres=gpu:1",
        "--requeue",
        f"--output=/store/runs/{RUN}/tasks/fit/logs/w1-2.log",
        "--comment=simrun:2",
        "--account=lab",
        f"--reservation=simrun-{RUN}",
        "--constraint=fast",
    ]:
        assert f"#SBATCH {option}" in lines, option
    assert "export SIMRUN_MEMORY_ENFORCED=1" in lines
    assert "export SIMRUN_ATTEMPT=$(( 2 + ${SLURM_RESTART_COUNT:-0} ))" in lines
    assert lines[-1] == "exec /venv/bin/python -m simrun_harness.worker"
    base = slurm.batch_script(
        slurm.BatchJob(
            launch=launch,
            argv=["true"],
            partition="p",
            cores=1,
            memory_mb=10,
            gpus=0,
            requeue=False,
            log_dir="/l",
            scratch_root="/s",
        )
    )
    assert "#SBATCH --no-requeue" in base and "--gres" not in base and "--account" not in base
    assert "export CUDA_VISIBLE_DEVICES=''" in base.splitlines(), "no GPUs: it sees none"
    assert "CUDA_VISIBLE_DEVICES" not in script, "Slurm names the GPUs of a job asking some"


def test_partitions_default_to_the_class_names():
    assert slurm.partition_of("simrun-owner-base", {}) == "simrun-owner-base"
    assert slurm.partition_of("simrun-owner-base", {"simrun-owner-base": "batch"}) == "batch"


def test_the_partitions_fragment_has_each_class_at_its_value():
    from simrun_core.planner import priority_class_values

    text = slurm.partitions_conf()
    assert "PreemptType=preempt/partition_prio" in text and "PreemptMode=REQUEUE" in text
    for name, tier in priority_class_values().items():
        assert f"PartitionName={name} Nodes=ALL PriorityTier={tier} " in text
