"""The GPUs a process may use and a machine has, read from the texts CUDA and nvidia-smi give."""

from __future__ import annotations

import pytest

from simrun_core.gpus import parse_nvidia_smi, parse_visible_devices, visible_devices


@pytest.mark.parametrize(
    ("text", "devices"),
    [
        ("3,5", ["3", "5"]),
        (" 0 , 1 ", ["0", "1"]),
        ("", []),
        ("GPU-aa,GPU-bb", ["GPU-aa", "GPU-bb"]),
        ("0,-1,2", ["0"]),
        ("-1", []),
        ("3,3", ["3"]),
        ("3,5,3,7", ["3", "5"]),
    ],
)
def test_cuda_visible_devices_as_cuda_reads_it(text: str, devices: list[str]) -> None:
    assert parse_visible_devices(text) == devices


def test_nvidia_smi_lines_name_their_gpus_by_uuid() -> None:
    text = "0, GPU-0a0a, 81559 MiB\n1, GPU-0b0b, 81559 MiB\n\n"
    assert parse_nvidia_smi(text) == ["GPU-0a0a", "GPU-0b0b"]
    assert parse_nvidia_smi("2, [N/A], 100 MiB\n") == ["2"], "by index without a UUID"


def test_the_gpus_a_process_was_given() -> None:
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "3"}) == ["3"]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_devices({"NVIDIA_VISIBLE_DEVICES": "GPU-aa"}) == ["GPU-aa"]
    assert visible_devices({"NVIDIA_VISIBLE_DEVICES": "void"}) == []
    assert visible_devices({"NVIDIA_VISIBLE_DEVICES": "all"}) is None
    assert visible_devices({}) is None
