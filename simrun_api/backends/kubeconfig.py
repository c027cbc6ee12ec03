"""The kubeconfig a service of the Argo backend reaches its cluster with, checked at its start.

Outside a cluster (no `KUBERNETES_SERVICE_HOST`) the backend loads the kubeconfig `KUBECONFIG`
names (files joined by `:`), else `~/.kube/config`, at its first call to the cluster, which a
starting service makes in its lifespan: a missing or broken file then ended the start in a
traceback of the server. `kubeconfig_problem` finds it before, as one line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import yaml
from kubernetes_asyncio.config import ConfigException, list_kube_config_contexts
from kubernetes_asyncio.config.kube_config import KUBE_CONFIG_DEFAULT_LOCATION

ENV_KUBECONFIG = "KUBECONFIG"


def kubeconfig_problem(environ: Mapping[str, str]) -> str | None:
    """What keeps the kubeconfig of an environment from being loaded, in one line naming the
    file; None in a cluster (its service account is used) or when it loads."""
    if environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    named = environ.get(ENV_KUBECONFIG)
    if named:
        where, files = f"{ENV_KUBECONFIG}={named}", named.split(os.pathsep)
    else:
        default = os.path.expanduser(KUBE_CONFIG_DEFAULT_LOCATION)  # the library's default
        where, files = f"{default} (the kubeconfig when {ENV_KUBECONFIG} is not set)", [default]
    files = [file for file in files if file]
    for file in files:
        what = "" if len(files) == 1 else f"{file} "
        if not Path(file).exists():
            return f"{where}: {what or 'the file '}does not exist"
        if not Path(file).is_file():
            return f"{where}: {what}is not a file"
    try:
        list_kube_config_contexts(named or files[0])  # checks its current context too
    except OSError as error:
        return f"{where}: cannot be read: {error.strerror or error}"
    except yaml.YAMLError as error:
        return f"{where}: not valid YAML: {_one_line(error)}"
    except ConfigException as error:
        return f"{where}: not a kubeconfig: {_one_line(error)}"
    except (AttributeError, TypeError, ValueError, KeyError) as error:
        return f"{where}: not a kubeconfig: {type(error).__name__}: {_one_line(error)}"
    return None


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())
