"""The options a cluster user reaches for: `submit --reserve NODE` (and `estimate --reserve`,
planned on the reserved node: tests/cluster/test_estimate_reserve.py), `serve --host`."""

from __future__ import annotations

from cli_helpers import run_simrun, write_squares


def test_a_reservation_reaches_the_service_which_refuses_it_without_reservations(tmp_path):
    workflow = write_squares(tmp_path)
    done = run_simrun("submit", str(workflow), "--local", "--reserve", "node-9", cwd=tmp_path)
    run_simrun("serve", "--local", "--stop", cwd=tmp_path)
    assert done.returncode == 1
    assert "reserve: node 'node-9' cannot be reserved: the local backend has no reservations" in (
        done.stderr
    )


def test_an_estimate_takes_a_reservation_as_submit_does(tmp_path):
    workflow = write_squares(tmp_path)
    done = run_simrun("estimate", str(workflow), "--local", "--reserve", "node-9", cwd=tmp_path)
    run_simrun("serve", "--local", "--stop", cwd=tmp_path)
    assert done.returncode == 1, done.stdout
    assert "reserve: node 'node-9' cannot be reserved: the local backend has no reservations" in (
        done.stderr
    )


def test_the_local_service_takes_no_host(tmp_path):
    done = run_simrun("serve", "--local", "--host", "0.0.0.0", cwd=tmp_path)
    assert done.returncode == 1
    assert "--host is for the service of SIMRUN_CONFIG" in done.stderr
