"""``memstrata cluster status`` and ``memstrata cluster down`` on a real one-node Ray cluster.

In process (``CliRunner``) the commands use this process's connection to the cluster; one run in
a process of its own joins the cluster by its address, as on a real deployment. The errors (the
local engine, an address nothing answers at) are one line each.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from memstrata import MemorySystem
from memstrata.bridges.cli import cli
from memstrata.testing import HashEmbedder
from tests._support import CLI_TIMEOUT, cli_env

ray = pytest.importorskip("ray", reason="the memstrata[ray] extra is not installed")

from tests._ray_support import BOUND_S, ray_cluster, ray_config  # noqa: E402

NAMESPACE = "memstrata-cli"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with ray_cluster(NAMESPACE, nodes=1) as made:
        yield made


def _config(tmp_path: Path, address: str, namespace: str) -> Any:
    """The Ray engine's config, its asks bounded as the command line's (a host's first start
    on a loaded 2-core machine can take longer than the default 30 s)."""
    return ray_config(tmp_path / "data", address, namespace, actors__ask_timeout_s=BOUND_S)


def _toml(path: Path, data_dir: Path, address: str, namespace: str) -> Path:
    path.write_text(
        f'data_dir = "{data_dir}"\n'
        f'[cluster]\nengine = "ray"\naddress = "{address}"\nnamespace = "{namespace}"\n'
        f"[actors]\nask_timeout_s = {BOUND_S:g}\n"
    )
    return path


def _run(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_status_and_down_show_and_end_the_hosts(cluster: Any, tmp_path: Path) -> None:
    namespace = f"{NAMESPACE}-status"
    config_file = _toml(tmp_path / "memstrata.toml", tmp_path / "data", cluster.address, namespace)
    system = MemorySystem.start(_config(tmp_path, cluster.address, namespace), embedder=HashEmbedder())
    system.agent("c0").store_knowledge("the on-call rota lives in the wiki", category="fact")
    system.blackboard("cs").publish("phase", "build", wait=True)
    system.stop(30)  # the driver goes, its hosts stay (detached)

    shown = _run("--config", str(config_file), "cluster", "status", "--json", "--timeout", "60")
    assert shown.exit_code == 0, shown.output
    report = json.loads(shown.output)
    node_id = ray.get_runtime_context().get_node_id()
    assert report["namespace"] == namespace and [n["node_id"] for n in report["nodes"]] == [node_id]
    hosts = report["hosts"]
    assert set(hosts) == {"agent:c0", "blackboard:cs"}
    assert "knowledge:c0" in hosts["agent:c0"]["actors"] and hosts["agent:c0"]["node"] == node_id
    assert all(on == node_id for on in report["embedders"].values()) and report["embedders"]

    lines = _run("--config", str(config_file), "cluster", "status", "--timeout", "60").output.splitlines()
    assert lines[0].startswith(
        f"cluster {cluster.address}, namespace {namespace}: 1 of 1 nodes alive, 2 hosts"
    )
    assert any(line.startswith("  agent:c0 (pid ") and line.endswith(": c0") for line in lines)
    assert any(line.startswith("  blackboard:cs (pid ") and line.endswith(": session cs") for line in lines)
    assert sum(line.startswith("  embedder:") for line in lines) == len(report["embedders"])

    ended = _run("--config", str(config_file), "cluster", "down")
    assert ended.exit_code == 0, ended.output
    assert sorted(ended.output.splitlines()) == sorted(
        f"ended {name}" for name in [*hosts, *report["embedders"]]
    )
    again = _run("--config", str(config_file), "cluster", "down")
    assert again.output == f"nothing to end in namespace {namespace}\n"
    with MemorySystem.start(_config(tmp_path, cluster.address, namespace), embedder=HashEmbedder()) as s:
        hits = s.agent("c0").query_knowledge("on-call rota", include_shared=False)  # the data stayed
        assert [h.entry.content for h in hits] == ["the on-call rota lives in the wiki"]
        assert s.stop_cluster(60) == []


def _memstrata(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memstrata", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        cwd=cwd,
        env=cli_env(),
        check=False,
    )


@pytest.mark.slow  # a process of its own that imports Ray and joins: seconds on a loaded machine
def test_a_process_of_its_own_joins_the_cluster_by_its_address(cluster: Any, tmp_path: Path) -> None:
    namespace = f"{NAMESPACE}-process"
    config_file = _toml(tmp_path / "memstrata.toml", tmp_path / "data", cluster.address, namespace)
    with MemorySystem.start(_config(tmp_path, cluster.address, namespace), embedder=HashEmbedder()) as s:
        s.items.put(("teams",), "ops", {"lead": "ana"})
    done = _memstrata(
        "--config", str(config_file), "cluster", "status", "--json", "--timeout", "60", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert list(report["hosts"]) == ["items"] and len(report["embedders"]) == 1
    done = _memstrata("--config", str(config_file), "cluster", "down", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    ended = sorted(["items", *report["embedders"]])
    assert json.loads(done.stdout) == {"namespace": namespace, "ended": ended, "problems": []}


def test_an_address_nothing_answers_at_is_one_line_at_once(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on once it is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config_file = _toml(tmp_path / "memstrata.toml", tmp_path / "data", f"127.0.0.1:{port}", NAMESPACE)
    for command in ("status", "down"):
        done = _memstrata("--config", str(config_file), "cluster", command, cwd=tmp_path)
        assert done.returncode == 1
        assert done.stderr == (
            f"memstrata: error: cannot join the Ray cluster at '127.0.0.1:{port}': nothing answers at "
            f"127.0.0.1:{port} within 5 s ([Errno 111] Connection refused)\n"
        )


def test_the_local_engine_has_no_cluster(tmp_path: Path) -> None:
    config_file = tmp_path / "memstrata.toml"
    for body, key in (
        ('[cluster]\nengine = "local"\n', "cluster.engine"),
        ('[cluster]\nengine = "ray"\naddress = "local"\n', "cluster.address"),
    ):
        config_file.write_text(f'data_dir = "{tmp_path / "data"}"\n{body}')
        for command in ("status", "down"):
            result = CliRunner().invoke(cli, ["--config", str(config_file), "cluster", command])
            assert result.exit_code == 2
            assert result.output.startswith(
                f"memstrata: error: no Ray cluster configured: config key '{key}'"
            )
            assert result.output.count("\n") == 1
    assert not (tmp_path / "data").exists()  # nothing was started
