"""The GPUs of the local service: those its own `CUDA_VISIBLE_DEVICES` names when set (empty:
none), else those `nvidia-smi` lists, else none (`simrun_core.gpus` reads the texts)."""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Mapping

from simrun_core.gpus import (
    CUDA_VISIBLE_DEVICES,
    NVIDIA_SMI_QUERY,
    parse_nvidia_smi,
    parse_visible_devices,
)

log = logging.getLogger(__name__)

NVIDIA_SMI_TIMEOUT_S = 20.0
"""The seconds `nvidia-smi` may take to list the GPUs (it loads the driver when idle)."""


def local_gpus(environ: Mapping[str, str] | None = None) -> list[str]:
    """The GPUs the local service may give its tasks, as `CUDA_VISIBLE_DEVICES` names them."""
    environ = os.environ if environ is None else environ
    if CUDA_VISIBLE_DEVICES in environ:
        return parse_visible_devices(environ[CUDA_VISIBLE_DEVICES])
    try:
        listed = subprocess.run(
            NVIDIA_SMI_QUERY,
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
            env=dict(environ),
            check=False,
        )
    except FileNotFoundError:
        return []
    except (OSError, subprocess.TimeoutExpired) as error:
        log.warning("no GPUs: %s did not list them: %s", NVIDIA_SMI_QUERY[0], error)
        return []
    if listed.returncode != 0:
        reason = listed.stderr.strip() or listed.stdout.strip() or f"exit {listed.returncode}"
        log.warning("no GPUs: %s failed: %s", NVIDIA_SMI_QUERY[0], reason)
        return []
    return parse_nvidia_smi(listed.stdout)
