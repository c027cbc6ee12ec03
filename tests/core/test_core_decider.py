"""The retries of the local backend, as on the cluster."""

from __future__ import annotations

from simrun_api.backends.local import STOP_RETRIES, decide_retry, exit_code


def test_a_kill_for_memory_is_retried_once_with_the_retry_memory():
    first = decide_retry(137, oom=True, on_retry_memory=False, stops=0, retry_per_worker_gb=0.375)
    assert (first.retry, first.retry_memory) == (True, True)
    assert first.message == "killed for memory; retried with 0.375 GiB per process"
    second = decide_retry(137, oom=True, on_retry_memory=True, stops=0, retry_per_worker_gb=0.375)
    assert (second.retry, second.retry_memory) == (False, True)
    assert "again with the retry memory of 0.375 GiB per process" in second.message


def test_a_process_stopped_from_outside_is_retried_a_few_times():
    for code in (137, 143, 128 + 1):
        decision = decide_retry(code, False, False, stops=0, retry_per_worker_gb=1)
        assert decision.retry and not decision.retry_memory, code
    last = decide_retry(143, False, False, stops=STOP_RETRIES, retry_per_worker_gb=1)
    assert not last.retry
    assert last.message == f"stopped from outside {STOP_RETRIES + 1} times"


def test_a_stop_keeps_the_retry_memory_of_an_earlier_kill():
    decision = decide_retry(143, False, on_retry_memory=True, stops=0, retry_per_worker_gb=1)
    assert decision.retry and decision.retry_memory


def test_any_other_exit_fails_at_once_naming_it():
    for code in (1, 3, 4, 2):
        decision = decide_retry(code, False, False, stops=0, retry_per_worker_gb=1)
        assert not decision.retry
        assert decision.message == f"exit code {code}"


def test_a_signal_is_an_exit_code_above_128():
    assert exit_code(-9) == 137
    assert exit_code(-15) == 143
    assert exit_code(3) == 3
