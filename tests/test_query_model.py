"""The default model of ``memstrata query`` in its helper process (``bridges/_query_model.py``):
forked only where that is safe, the same vectors as a load in the process, its failures said,
no standard stream held, an end when its pipe closes or its lifetime is over, whatever its
starter left behind (a standard stream closed, signals ignored), stopped when it is closed
while it loads, and reaped by the command: no process is left behind.

The helper is forked from a fresh interpreter (this process has threads and numpy loaded, where
no helper is forked): each test runs a short script in one and reads its last line of JSON."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memstrata.bridges import _query_model
from memstrata.storage._model_id import DEFAULT_MODEL_ID as _DEFAULT_MODEL_ID
from tests._support import CLI_TIMEOUT, cli_env

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the helper is forked on Linux")

_HELPER = r"""
import json, os, select, sys
from memstrata.bridges import _query_model

def ended(pid, seconds):  # whether the helper ended within the bound (no polling: its pidfd)
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], seconds)[0])
    finally:
        os.close(fd)

def streams(pid):
    return sorted({os.readlink(f"/proc/{pid}/fd/{n}") for n in (0, 1, 2)})
"""


def _run(script: str, *args: str, env: dict[str, str] | None = None) -> Any:
    done = subprocess.run(
        [sys.executable, "-c", _HELPER + script, *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        env=env or cli_env(),
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("argv", "wanted"),
    [
        (["query", "x"], True),
        (["query"], True),  # refused by the command line later (a wrong yes)
        (["query", "--mode"], True),
        (["--data-dir", "d", "--debug", "query", "x", "-a", "dev", "--json"], True),
        (["--data-dir=d", "--config", "c.toml", "query", "x", "--mode", "vector"], True),
        (["--data-dir", "query", "status"], False),  # "query" is the data dir there
        (["status"], False),
        (["knowledge", "query"], False),
        (["query", "x", "--mode", "keyword"], False),
        (["query", "x", "--mode=keyword"], False),
        (["query", "--help"], False),
        (["--version"], False),
        ([], False),
    ],
)
def test_the_console_script_forks_a_helper_for_a_query_that_needs_the_model(
    argv: list[str], wanted: bool
) -> None:
    assert _query_model.wanted(argv) is wanted


def test_the_root_options_skipped_with_their_values_are_the_command_lines() -> None:
    import click

    from memstrata.bridges.cli import cli

    with_values = {opt for p in cli.params if isinstance(p, click.Option) and not p.is_flag for opt in p.opts}
    assert with_values == set(_query_model._ROOT_VALUE_OPTIONS)


def test_no_helper_is_forked_from_a_process_with_threads_or_numpy() -> None:
    assert "numpy" in sys.modules  # as in this test process
    assert _query_model.start() is None


def test_closing_never_waits_for_a_reply_still_awaited() -> None:
    """A late vector the command no longer waits for (its bound passed) must not hold the
    command at its end: closing returns while another thread still awaits the helper's reply,
    stops the helper's process, and that thread gets the reply if it still comes. The helper
    here is the test, on real pipes, and its process one that waits for its input's end."""
    requests_read, requests_write = os.pipe()
    replies_read, replies_write = os.pipe()
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    model = _query_model.QueryModel(
        os.fdopen(requests_write, "wb"), os.fdopen(replies_read, "rb"), process.pid
    )
    got: list[Any] = []
    waiting = threading.Thread(target=lambda: got.append(model.embed_query("late")), daemon=True)
    waiting.start()
    with os.fdopen(requests_read, "rb") as helper_in, os.fdopen(replies_write, "wb") as helper_out:
        assert _query_model._receive(helper_in) == b"late"  # asked: the thread now awaits the reply
        closing = threading.Thread(target=model.close, daemon=True)
        closing.start()
        closing.join(CLI_TIMEOUT)
        returned_while_awaited = not closing.is_alive()
        assert helper_in.read() == b""  # the helper reads the end of its requests
        _query_model._send(helper_out, b"=" + np.arange(4, dtype="<f4").tobytes())
    waiting.join(CLI_TIMEOUT)
    assert returned_while_awaited
    assert len(got) == 1 and got[0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert model._replies.closed  # closed by the thread that awaited it
    assert process.wait(CLI_TIMEOUT) == -signal.SIGTERM  # stopped: its input never ended
    assert process.stdin is not None
    process.stdin.close()


def test_no_helper_is_forked_beside_a_running_thread() -> None:
    found = _run(
        "import threading\n"
        "stop = threading.Event()\n"
        "worker = threading.Thread(target=stop.wait)\n"
        "worker.start()\n"
        "beside = _query_model.start()\n"
        "stop.set(); worker.join()\n"
        "alone = _query_model.start()\n"
        "print(json.dumps({'beside': beside is None, 'alone': alone is not None}))\n"
        "alone.close()\n"
    )
    assert found == {"beside": True, "alone": True}


_SAME = """
texts = ["the payment adapter times out", "  cache\\tstamps\\n", "日本語のテキストと emoji 🚀", "x " * 3000]
helper = _query_model.start()
model = helper.load()
helped = [model.embed_query(t).tolist() for t in texts]
documents = model.embed_documents(texts[:2]).tolist()
loaded_here = "onnxruntime" in sys.modules
pid = model.pid
held = streams(pid)
helper.close()
gone = ended(pid, 60)
from memstrata.storage import default_embedder
own = default_embedder()
print(json.dumps({"same": helped == [own.embed_query(t).tolist() for t in texts],
                  "documents": documents == own.embed_documents(texts[:2]).tolist(),
                  "loaded_here": loaded_here, "other": pid != os.getpid(), "held": held, "gone": gone}))
"""


_HANDLER = r"""
import signal
def name():
    handler = signal.getsignal(signal.SIGTERM)
    return "default" if handler == signal.SIG_DFL else getattr(handler, "__name__", repr(handler))
before = name()
first, second = _query_model.start(), _query_model.start()
during = name()
first.reap()
one_left = name()
second.reap()
print(json.dumps({"before": before, "during": during, "one_left": one_left, "after": name()}))
"""


def test_the_sigterm_handler_of_a_query_lasts_as_long_as_its_helpers() -> None:
    """The handler that lets a command ended by ``SIGTERM`` reap its helper was left installed
    after the helpers were reaped: a program running the command line in its own process kept it."""
    found = _run(_HANDLER)
    assert found == {
        "before": "default",
        "during": "_terminated",
        "one_left": "_terminated",
        "after": "default",
    }, found


@pytest.mark.model
def test_the_helper_computes_what_the_process_would_and_ends_with_its_pipe() -> None:
    found = _run(_SAME)
    assert found["same"] is True and found["documents"] is True  # bitwise
    assert found["loaded_here"] is False and found["other"] is True  # computed in the helper
    assert found["held"] == ["/dev/null"]  # no stream of the command's: its reader sees the end
    assert found["gone"] is True


@pytest.mark.model
def test_a_command_started_with_its_standard_input_closed_still_gets_its_vector() -> None:
    """The first pipe then takes descriptor 0, which the helper points at /dev/null: the pipe is
    moved out of the way first."""
    found = _run(
        "os.close(0)\n"
        "helper = _query_model.start()\n"
        "model = helper.load()\n"
        "vector = model.embed_query('cache stamps')\n"
        "print(json.dumps({'dim': len(vector), 'held': streams(model.pid)}))\n"
        "helper.close()\n"
    )
    assert found == {"dim": 384, "held": ["/dev/null"]}


@pytest.mark.model
def test_a_command_whose_starter_ignores_sigchld_still_gets_its_vector() -> None:
    """Children are then reaped by the system at once, and waiting for one finds none."""
    found = _run(
        "import signal\n"
        "signal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
        "helper = _query_model.start()\n"
        "vector = helper.load().embed_query('cache stamps')\n"
        "print(json.dumps({'dim': len(vector)}))\n"
        "helper.close()\n"
    )
    assert found == {"dim": 384}


@pytest.mark.model
def test_a_helper_that_cannot_load_the_model_says_why(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    env = {**cli_env(), "MEMSTRATA_MODEL_DIR": str(blocked / "models")}
    found = _run(
        "from memstrata.core.errors import EmbedderUnavailableError\n"
        "helper = _query_model.start()\n"
        "try:\n"
        "    helper.load()\n"
        "except EmbedderUnavailableError as exc:\n"
        "    print(json.dumps({'error': str(exc)}))\n"
        "helper.close()\n",
        env=env,
    )
    assert "cannot assemble the default model directory" in found["error"]
    assert str(blocked) in found["error"]


@pytest.mark.model
def test_a_helper_gone_is_a_model_fault_of_the_query() -> None:
    found = _run(
        "import signal\n"
        "from memstrata.core.errors import ModelFaultError\n"
        "helper = _query_model.start()\n"
        "model = helper.load()\n"
        "os.kill(model.pid, signal.SIGKILL)\n"
        "assert ended(model.pid, 60)\n"
        "try:\n"
        "    model.embed_query('cache stamps')\n"
        "except ModelFaultError as exc:\n"
        "    print(json.dumps({'error': str(exc)}))\n"
        "helper.close()\n"
    )
    assert found["error"].startswith("the model's helper process")


@pytest.mark.model
def test_after_the_last_text_the_helper_ends_by_itself() -> None:
    """The command's one text: once it is sent the helper's requests end, so the helper ends
    (its memory freed) while the command still searches; a text after it is refused."""
    found = _run(
        "from memstrata.core.errors import ModelFaultError\n"
        "helper = _query_model.start()\n"
        "helper.last('cache stamps')\n"
        "model = helper.load()\n"
        "dim = len(model.embed_query('cache stamps'))\n"
        "gone = ended(helper.pid, 60)\n"
        "try:\n"
        "    model.embed_query('another text')\n"
        "    refused = None\n"
        "except ModelFaultError as exc:\n"
        "    refused = str(exc)\n"
        "helper.close()\n"
        "print(json.dumps({'dim': dim, 'gone': gone, 'refused': refused}))\n"
    )
    assert found["dim"] == 384 and found["gone"] is True
    assert found["refused"].startswith("the model's helper process is gone")


def test_a_helper_closed_while_it_loads_is_stopped_not_waited_for(tmp_path: Path) -> None:
    """Its load blocks here for good (the model folder's stamp is a pipe nobody writes to),
    and neither its lifetime nor the command's bound on its end would come first: closing it
    stops it, its load unwinds and it ends on its own (exit status 0)."""
    stamp = tmp_path / "models" / _DEFAULT_MODEL_ID / "memstrata-model.json"
    stamp.parent.mkdir(parents=True)
    os.mkfifo(stamp)
    found = _run(
        "_query_model.LIFETIME_S = 3600\n"
        "helper = _query_model.start()\n"
        "helper.close()\n"
        "ended_now = ended(helper.pid, 60)\n"
        "status = os.waitpid(helper.pid, 0)[1] if ended_now else None\n"
        "print(json.dumps({'ended': ended_now, 'code': status and os.waitstatus_to_exitcode(status)}))\n",
        env={**cli_env(), "MEMSTRATA_MODEL_DIR": str(tmp_path / "models")},
    )
    assert found == {"ended": True, "code": 0}


@pytest.mark.model
def test_a_helper_ends_after_its_lifetime_even_with_its_pipe_open() -> None:
    found = _run(
        "import signal\n"
        "signal.signal(signal.SIGALRM, signal.SIG_IGN)  # as a parent that ignores it would pass on\n"
        "_query_model.LIFETIME_S = 1\n"
        "helper = _query_model.start()\n"
        "model = helper.load()\n"
        "print(json.dumps({'ended': ended(model.pid, 60)}))\n"  # the pipe is still open here
        "helper.close()\n"
    )
    assert found == {"ended": True}


_QUERY = r"""
import io, contextlib
from pathlib import Path
from memstrata.bridges.cli import cli
from memstrata.bridges._app import CliState
from memstrata.bridges import _cli_query

def answer(state):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli.main(["query", sys.argv[2], "-a", "dev", "--json"], obj=state,
                 standalone_mode=False)
    return json.loads(out.getvalue())

data = Path(sys.argv[1])
helped = CliState(data_dir=data)
first = answer(helped)
loaded_here = "onnxruntime" in sys.modules
_cli_query.query_knowledge = lambda *args, **kwargs: None  # the system answers instead
second = answer(CliState(data_dir=data))
print(json.dumps({"in_process": helped.answered_in_process, "loaded_here": loaded_here,
                  "same": first == second, "hits": len(first)}))
"""


_CONSOLE = r"""
import json, sys
from memstrata.bridges import _console, _query_model
real = _query_model.start

def spy():  # says when a helper is forked: before the command line is imported, or after
    sys.stderr.write(json.dumps({"click_loaded": "click" in sys.modules}) + "\n")
    sys.stderr.flush()
    return real()

_query_model.start = spy
sys.argv = ["memstrata", "--data-dir", sys.argv[1], *sys.argv[2:]]
_console.main()
"""
_IN_PROCESS = "import sys\nfrom memstrata.bridges.cli import main\nsys.argv[0] = 'memstrata'\nmain()\n"


@pytest.mark.model
def test_the_console_script_forks_the_helper_first_and_the_command_takes_it(tmp_path: Path) -> None:
    """One helper, forked before the command line is imported, and the same hits as the command
    run without the console script (its helper forked by the command itself)."""
    from memstrata.layers import KnowledgeStore
    from memstrata.storage import load_embedder

    data = tmp_path / "data"
    with KnowledgeStore.open(KnowledgeStore.path_for(data, "dev"), load_embedder(None)) as store:
        store.add_many([{"content": f"Cache stamps note {i}", "category": "pattern"} for i in range(4)])
    args = ["query", "how are cache stamps used", "-a", "dev", "--json"]

    def run(script: str, *argv: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-c", script, *argv],
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT,
            env=cli_env(),
        )
        assert done.returncode == 0, done.stderr
        return done

    console = run(_CONSOLE, str(data), *args)
    forks = [json.loads(line) for line in console.stderr.splitlines() if line.startswith("{")]
    assert forks == [{"click_loaded": False}]
    plain = run(_IN_PROCESS, "--data-dir", str(data), *args)
    hits = json.loads(console.stdout)
    assert hits == json.loads(plain.stdout) and len(hits) == 4
    keyword = run(_CONSOLE, str(data), *args, "--mode", "keyword")
    assert [line for line in keyword.stderr.splitlines() if line.startswith("{")] == []


@pytest.mark.model
def test_the_query_command_answers_through_its_helper_as_the_system_does(tmp_path: Path) -> None:
    from memstrata.layers import KnowledgeStore
    from memstrata.storage import load_embedder

    data = tmp_path / "data"
    with KnowledgeStore.open(KnowledgeStore.path_for(data, "dev"), load_embedder(None)) as store:
        store.add_many(
            [
                {"content": "Cache invalidation uses version stamps", "category": "pattern"},
                {"content": "Stale caches are dropped on deploy", "category": "pitfall"},
                {"content": "The payment adapter retries card authorisation", "category": "outcome"},
            ]
        )
    found = _run(_QUERY, str(data), "how are caches invalidated")
    assert found == {"in_process": True, "loaded_here": False, "same": True, "hits": 3}
    # longer than a query's vector is made of: the one text the helper is sent is the searches'
    long = "why are stale caches dropped on deploy " * 300
    assert _run(_QUERY, str(data), long) == {
        "in_process": True,
        "loaded_here": False,
        "same": True,
        "hits": 3,
    }


_ORPHANS = r"""
import ctypes, json, os, subprocess, sys
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
done = subprocess.run([sys.executable, "-m", "memstrata", *sys.argv[1:]], capture_output=True, text=True)
left = []  # the command's orphans come to this process: each is waited for
while True:
    try:
        left.append(os.waitpid(-1, 0)[0])
    except ChildProcessError:
        break
print(json.dumps({"code": done.returncode, "left": left}))
"""


@pytest.mark.model
def test_a_query_leaves_no_process_behind(tmp_path: Path) -> None:
    """An orphan goes to its PID namespace's first process, which in a container started
    without an init never reaps it: the command reaps its helper itself, whether the helper
    answered, was not needed, or the command line was refused before it ran. The orphans are
    seen here by running the command under a subreaper."""
    from memstrata.layers import KnowledgeStore
    from memstrata.storage import load_embedder

    data = tmp_path / "data"
    with KnowledgeStore.open(KnowledgeStore.path_for(data, "dev"), load_embedder(None)) as store:
        store.add_many([{"content": "Cache stamps are compared on read", "category": "pattern"}])

    def run(*args: str) -> Any:
        done = subprocess.run(
            [sys.executable, "-c", _ORPHANS, "--data-dir", str(data), *args],
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT,
            env=cli_env(),
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    assert run("query", "how are cache stamps used", "-a", "dev") == {"code": 0, "left": []}
    assert run("query", "how are cache stamps used", "-a", "nobody") == {"code": 0, "left": []}
    assert run("query") == {"code": 2, "left": []}  # no text: refused by the command line


_TERMINATED = r"""
import ctypes, json, os, subprocess, sys
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
stamp = sys.argv[1]  # a pipe: the helper's load opens it and waits there
command = subprocess.Popen([sys.executable, "-m", "memstrata", *sys.argv[2:]], stderr=subprocess.PIPE)
with open(stamp, "w"):  # opened once the helper has opened it: the command has its helper
    command.terminate()
    code = command.wait()
left = []
while True:
    try:
        left.append(os.waitpid(-1, 0)[0])
    except ChildProcessError:
        break
print(json.dumps({"code": code, "left": left}))
"""


@pytest.mark.model
def test_a_query_ended_by_sigterm_leaves_no_process_behind(tmp_path: Path) -> None:
    """A ``timeout`` or a container stopped sends ``SIGTERM``: the command ends with the status
    a shell gives it and reaps its helper (stopped in its load, which waits on a pipe here)."""
    from memstrata.layers import KnowledgeStore
    from memstrata.storage import load_embedder

    data = tmp_path / "data"
    with KnowledgeStore.open(KnowledgeStore.path_for(data, "dev"), load_embedder(None)) as store:
        store.add_many([{"content": "Cache stamps are compared on read", "category": "pattern"}])
    config = tmp_path / "memstrata.toml"
    config.write_text("[actors]\nask_timeout_s = 600\nquery_embed_timeout_s = 300\n")  # waits for the model
    stamp = tmp_path / "models" / _DEFAULT_MODEL_ID / "memstrata-model.json"
    stamp.parent.mkdir(parents=True)
    os.mkfifo(stamp)
    args = [
        "--config",
        str(config),
        "--data-dir",
        str(data),
        "query",
        "how are cache stamps used",
        "-a",
        "dev",
    ]
    done = subprocess.run(
        [sys.executable, "-c", _TERMINATED, str(stamp), *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        env={**cli_env(), "MEMSTRATA_MODEL_DIR": str(tmp_path / "models")},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"code": 128 + signal.SIGTERM, "left": []}
