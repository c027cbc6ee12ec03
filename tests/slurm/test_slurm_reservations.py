"""Node reservations on the real Slurm of the tests, through the backend: each run's reservation
is `simrun-<run id>` of its node, so two runs reserving two nodes never collide, and a run's
reservation that holds several nodes (an admin gave it more: Slurm prints `node[1-2]`) reserves
each of them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_cluster import SlurmCluster

from simrun_api.backends.base import ReservationRefused
from simrun_api.backends.slurm import SlurmBackend
from simrun_core.slurm import reservation_name
from simrun_core.slurm_jobs import SlurmSettings

FIRST, SECOND, THIRD = (f"20260102-000000-00000{n}" for n in (1, 2, 3))


@pytest.fixture
def backend(idle_slurm: SlurmCluster, tmp_path: Path) -> Iterator[SlurmBackend]:
    """A backend of the cluster; every reservation of the test's runs deleted after."""
    yield SlurmBackend(tmp_path / "store", SlurmSettings(grace_s=5), env=idle_slurm.env)
    for run_id in (FIRST, SECOND, THIRD):
        idle_slurm.run(
            "scontrol", "delete", f"reservationname={reservation_name(run_id)}", check=False
        )


def reserved_by(backend: SlurmBackend) -> dict[str, str | None]:
    return {server.name: server.reserved_by for server in asyncio.run(backend.servers())}


def test_two_runs_reserve_two_nodes_without_colliding(backend):
    asyncio.run(backend.reserve("node1", FIRST))
    asyncio.run(backend.reserve("node2", SECOND))
    assert reserved_by(backend) == {"node1": FIRST, "node2": SECOND, "node3": None}
    asyncio.run(backend.reserve("node1", FIRST))  # again: nothing new
    with pytest.raises(ReservationRefused, match=f"node 'node2' is reserved for run {SECOND}"):
        asyncio.run(backend.reserve("node2", THIRD))
    asyncio.run(backend.release("node1", FIRST))
    assert reserved_by(backend) == {"node1": None, "node2": SECOND, "node3": None}


def test_a_runs_reservation_of_several_nodes_reserves_each(backend, idle_slurm):
    asyncio.run(backend.reserve("node1", FIRST))
    idle_slurm.run(
        "scontrol", "update", f"reservationname={reservation_name(FIRST)}", "nodes=node1,node2"
    )
    shown = idle_slurm.run("scontrol", "show", "reservation", reservation_name(FIRST)).stdout
    assert "Nodes=node[1-2]" in shown, shown
    assert reserved_by(backend) == {"node1": FIRST, "node2": FIRST, "node3": None}
    nodes = {node.name: node.reserved_by for node in asyncio.run(backend.nodes())}
    assert nodes == {"node1": FIRST, "node2": FIRST, "node3": None}
    with pytest.raises(ReservationRefused, match=f"node 'node2' is reserved for run {FIRST}"):
        asyncio.run(backend.reserve("node2", SECOND))
