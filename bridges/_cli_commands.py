"""Today's everyday commands: store, query, remember, recall, index, search, get, watch, status, ...

They predate the commands generated from the registry and keep their options and output (a
bare JSON list of hits, ``stored N (agent ...)`` lines); each also exists in its group
(``memstrata knowledge store``, ...) with the registry's result shape. ``index``, ``search`` and
``get`` are the registry's file operations themselves (``index``, ``search_files``,
``get_file``), as are ``status``, ``export`` and ``import``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from memstrata.core.constants import MAX_TOP_K, MODES
from memstrata.core.errors import MemstrataError, RootMissingError

from . import _cli_shared as sh
from ._cli_cluster import cluster
from ._cli_output import IndexProgress, echo_hits, heartbeat, sync_summary

if TYPE_CHECKING:
    from memstrata._workspaces import Workspaces

__all__ = ["COMMANDS"]


@click.command()
@click.argument("content")
@sh.agent_option
@click.option("--category", "-c", required=True, help="outcome, pitfall, pattern, codebase, preference, ...")
@sh.tag_option
@click.option("--scope", default=None, help="Path-like scope, default '/'.")
@sh.json_option
@click.pass_context
def store(
    ctx: click.Context,
    content: str,
    agent_id: str,
    category: str,
    tags: tuple[str, ...],
    scope: str | None,
    as_json: bool,
) -> None:
    """Store CONTENT ('-' reads stdin) in an agent's long-term knowledge."""
    options = sh.given(category=category, tags=sh.parse_tags(tags), scope=scope)
    with sh.state(ctx).system() as system:
        ident = system.agent(agent_id).store_knowledge(sh.content(content), **options)
    sh.echo_result(
        as_json,
        {"id": ident, "agent": agent_id, "category": category},
        f"stored {ident} (agent {agent_id}, category {category})",
    )


@click.command()
@click.argument("query")
@sh.agent_option
@click.option("--category", "-c", default=None, help="Only this category.")
@sh.tag_option
@click.option("--scope", default=None, help="Entries of this scope and its ancestors.")
@click.option(
    "--top-k", "-k", type=click.IntRange(1, MAX_TOP_K), default=None, help="How many hits (default 10)."
)
@click.option("--mode", type=click.Choice(MODES), default=None)
@click.option("--min-score", type=sh.FiniteRange(0, 1), default=None, help="Cosine floor (semantic side).")
@sh.json_option
@click.pass_context
def query(
    ctx: click.Context,
    query: str,
    agent_id: str,
    category: str | None,
    tags: tuple[str, ...],
    scope: str | None,
    top_k: int | None,
    mode: str | None,
    min_score: float | None,
    as_json: bool,
) -> None:
    """Search an agent's long-term knowledge (hybrid vector + keyword by default)."""
    from . import _convert

    options = sh.given(
        category=category, tags=sh.parse_tags(tags), scope=scope, top_k=top_k, mode=mode, min_score=min_score
    )
    state = sh.state(ctx)
    hits: list[dict[str, Any]] = []
    found = None
    from ._query_model import start, take_early

    helper = take_early()  # forked by the console script, before the command line was imported
    if state.embedder is not None or mode == "keyword":
        if helper is not None:
            helper.close()
        helper = None
    elif helper is None:  # the model loads while the config is read
        helper = start()
    try:
        if state.store_exists("knowledge", agent_id):  # searched in this process, no system started
            from ._cli_query import query_knowledge

            found = query_knowledge(state.config, state.embedder, agent_id, query, options, helper)
    finally:
        if helper is not None:
            helper.close()
    if found is not None:
        hits = [_convert.knowledge_hit(h) for h in found]
    elif state.store_exists("knowledge", agent_id) or state.store_exists("knowledge", "shared", shared=True):
        with state.system() as system:
            hits = [
                _convert.knowledge_hit(h) for h in system.agent(agent_id).query_knowledge(query, **options)
            ]
    else:  # nothing to search, but what a search would refuse is refused
        from memstrata.messages import QueryKnowledge

        QueryKnowledge(agent_id, query, **options)
    echo_hits(
        hits,
        as_json,
        "no matching knowledge",
        lambda hit: f"{hit.get('category')}  {hit.get('match_type')}",
    )
    state.answered_in_process = found is not None


@click.command()
@click.argument("content")
@sh.agent_option
@click.option("--title", default=None)
@click.option("--task-run", "task_run_id", default=None, help="The task run this episode belongs to.")
@sh.tag_option
@sh.json_option
@click.pass_context
def remember(
    ctx: click.Context,
    content: str,
    agent_id: str,
    title: str | None,
    task_run_id: str | None,
    tags: tuple[str, ...],
    as_json: bool,
) -> None:
    """Record CONTENT ('-' reads stdin) as an episode in an agent's episodic memory."""
    options = {
        k: v
        for k, v in {"title": title, "task_run_id": task_run_id, "tags": sh.parse_tags(tags)}.items()
        if v
    }
    with sh.state(ctx).system() as system:
        ident = system.agent(agent_id).remember(sh.content(content), **options)
    sh.echo_result(as_json, {"id": ident, "agent": agent_id}, f"remembered {ident} (agent {agent_id})")


@click.command()
@click.argument("query")
@sh.agent_option
@click.option("--task-run", "task_run_id", default=None, help="Only this task run.")
@click.option("--since", default=None, help="ISO 8601 date-time with a time zone.")
@click.option("--until", default=None, help="ISO 8601 date-time with a time zone.")
@click.option("--top-k", "-k", type=click.IntRange(1, MAX_TOP_K), default=None)
@sh.json_option
@click.pass_context
def recall(
    ctx: click.Context,
    query: str,
    agent_id: str,
    task_run_id: str | None,
    since: str | None,
    until: str | None,
    top_k: int | None,
    as_json: bool,
) -> None:
    """Search an agent's episodic memory."""
    from . import _convert

    options = sh.given(
        task_run_id=task_run_id, since=sh.when(since, "since"), until=sh.when(until, "until"), top_k=top_k
    )
    state = sh.state(ctx)
    hits: list[dict[str, Any]] = []
    if state.store_exists("episodic", agent_id):
        with state.system() as system:
            hits = [_convert.episode_hit(h) for h in system.agent(agent_id).recall(query, **options)]
    echo_hits(
        hits,
        as_json,
        "no matching episodes",
        lambda hit: f"{hit.get('at', '')}" + (f"  {hit['title']}" if hit.get("title") else ""),
    )


# -- files ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def _indexed(ctx: click.Context) -> Iterator[Workspaces]:
    """The file-index registry for a read; refused when no root was ever indexed (and never
    created by the read)."""
    state = sh.state(ctx)
    if not state.has_workspaces():
        raise MemstrataError("no memories indexed yet (run: memstrata index PATH)")
    with state.workspaces() as registry:
        if not registry.roots():
            raise MemstrataError("no memories indexed yet (run: memstrata index PATH)")
        yield registry


@click.command()
@click.argument("path", type=sh.PathParam(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--kind",
    type=click.Choice(["auto", "memory", "code"]),
    default="auto",
    show_default=True,
    help="auto: a memory workspace when it holds MEMORY.md or memory/, else a codebase.",
)
@click.option(
    "--progress-every",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Print a progress line on stderr every N files (and at least every 2 s while files are indexed).",
)
@sh.json_option
@click.pass_context
def index(ctx: click.Context, path: Path, kind: str, progress_every: int, as_json: bool) -> None:
    """Index (or re-sync) the folder PATH; later searches cover it.

    Progress lines and a final summary go to stderr, on a terminal or a pipe alike.
    """
    from . import _convert

    progress = IndexProgress(sys.stderr, every=progress_every)
    with sh.state(ctx).workspaces() as registry:
        ws, stats = registry.index(path, kind=kind, progress=progress)  # type: ignore[arg-type]
    data = _convert.plain(stats)
    summary = f"indexed {sh.shown(ws.root)} as {ws.kind}: {sync_summary(data)}"
    if as_json:  # stdout holds the JSON document: the summary line goes with the progress lines
        click.echo(f"{sh.PROG}: {summary}", err=True)
        sh.echo_json({"root": str(ws.root), "kind": ws.kind, "stats": data})
        return
    click.echo(summary)


@click.command()
@click.argument("query")
@click.option("--root", type=sh.PathParam(path_type=Path), default=None, help="Only this indexed root.")
@click.option("--top-k", "-k", type=click.IntRange(1, 1000), default=None, help="How many hits (default 6).")
@click.option("--min-score", type=sh.FiniteRange(0, 1), default=None, help="Cosine floor (semantic side).")
@click.option("--language", default=None, help="Only files in this language (e.g. python, markdown).")
@sh.json_option
@click.pass_context
def search(
    ctx: click.Context,
    query: str,
    root: Path | None,
    top_k: int | None,
    min_score: float | None,
    language: str | None,
    as_json: bool,
) -> None:
    """Search every indexed root (memory files and source trees)."""
    with _indexed(ctx) as registry:
        hits = registry.search(
            query, root=root, max_results=top_k, min_score=min_score, **sh.given(language=language)
        )
    for warning in getattr(hits, "warnings", ()):  # e.g. a root whose folder is gone: skipped
        click.echo(sh.warning_line(warning), err=True)
    if not getattr(hits, "complete", True):
        click.echo(sh.warning_line("a sync was still running: some files were not searched yet"), err=True)
    if getattr(hits, "degraded", None):  # e.g. the query embedding failed: ranked by keywords
        click.echo(sh.warning_line(str(hits.degraded)), err=True)
    if as_json:
        sh.echo_json([h.as_dict() for h in hits])
        return
    if not hits:
        click.echo("no matches")
    for rank, hit in enumerate(hits, 1):
        where = f"{sh.shown(hit.absolute_path)}:{hit.start_line}-{hit.end_line}"
        click.echo(f"{rank}. {hit.score:.2f}  {where}  ({hit.match_type})")
        for line in hit.snippet.strip().splitlines()[:4]:
            click.echo(f"   {sh.one_line(line)}")


@click.command()
@click.argument("path")
@click.option(
    "--from", "from_line", type=click.IntRange(min=1), default=1, show_default=True, help="First line."
)
@click.option("--lines", type=click.IntRange(min=1), default=50, show_default=True, help="How many lines.")
@click.option("--root", type=sh.PathParam(path_type=Path), default=None, help="The indexed root PATH is in.")
@sh.json_option
@click.pass_context
def get(ctx: click.Context, path: str, from_line: int, lines: int, root: Path | None, as_json: bool) -> None:
    """Print lines of an indexed file (absolute, relative to the current folder, or to its root)."""
    from memstrata.core.errors import MemstrataError, PathOutsideRootError

    local = root is None and not os.path.isabs(os.path.expanduser(path)) and os.path.lexists(path)
    with _indexed(ctx) as registry:
        try:  # a path that exists here is read from here; if no root holds it, try the roots
            text = registry.get(
                os.path.abspath(path) if local else path, root=root, from_line=from_line, lines=lines
            )
        except PathOutsideRootError as outside:
            if not local:
                raise
            try:
                text = registry.get(path, from_line=from_line, lines=lines)
            except MemstrataError:  # no root holds it either: the file here is what was meant
                raise outside from None
    if as_json:
        sh.echo_json(text.as_dict())
    else:
        click.echo(text.text, nl=not text.text.endswith("\n"))


@click.command()
@click.argument("path", type=sh.PathParam(exists=True, file_okay=False, path_type=Path))
@click.option("--kind", type=click.Choice(["auto", "memory", "code"]), default="auto", show_default=True)
@click.pass_context
def watch(ctx: click.Context, path: Path, kind: str) -> None:
    """Keep PATH's index in sync with its files until Ctrl-C.

    A failed sync prints one line on stderr and watching goes on; when PATH is deleted (or
    moved away) that is said once, and watching resumes when a folder is back at PATH.
    """
    from . import _convert

    stop = threading.Event()

    def synced(ws: Any, stats: Any) -> None:
        data = _convert.plain(stats)
        if isinstance(data, dict) and not (data.get("files_processed") or data.get("files_deleted")):
            return
        click.echo(f"synced {sh.shown(ws.root)}: {sync_summary(data)}")

    def failed(ws: Any, exc: BaseException) -> None:  # one line each; watching goes on
        if isinstance(exc, RootMissingError):
            click.echo(sh.warning_line(str(exc)), err=True)
        else:
            click.echo(sh.fail_line(f"sync of {ws.root} failed: {exc}"), err=True)

    with sh.state(ctx).workspaces() as registry:
        roots = registry.watch(path, kind=kind, on_synced=synced, on_error=failed)  # type: ignore[arg-type]
        for ws in roots:
            click.echo(f"watching {sh.shown(ws.root)} ({ws.kind}); press Ctrl-C to stop")
        with sh.stop_on_signals(stop.set):
            stop.wait()
    click.echo("stopped watching", err=True)


# -- status --------------------------------------------------------------------------------------


@click.command()
@click.option("--verbose", "-v", is_flag=True, help="Also print every detail of the report.")
@sh.json_option
@click.pass_context
def status(ctx: click.Context, verbose: bool, as_json: bool) -> None:
    """Drivers, vectors, model, counts per store, sync state and degraded agents."""
    from . import _status

    state = sh.state(ctx)
    data_dir = Path(state.config.data_dir)
    if not data_dir.exists():  # a read: report the empty state, create nothing
        sh.echo_result(
            as_json, _status.empty(data_dir), f"no memory stored yet: the data dir {data_dir} does not exist"
        )
        return
    # nothing is started and no model loaded to count: read-only queries per store
    report = _status.collect_offline(state.config, state.embedder)
    if as_json:
        sh.echo_json(report)
        return
    for line in _status.render({**report, "verbose": verbose}):
        click.echo(line)
    for warning in _status.warnings(report):
        click.echo(f"{sh.PROG}: warning: {warning}", err=True)


@click.command("export")
@click.argument("path", type=sh.PathParam(dir_okay=False, path_type=Path))
@sh.json_option
@click.pass_context
def export_cmd(ctx: click.Context, path: Path, as_json: bool) -> None:
    """Write every memory (knowledge, episodes, working memory, blackboards) to PATH as sorted JSON lines."""
    with sh.state(ctx).system() as system, heartbeat("export", sys.stderr):
        lines = system.export(path)
    sh.echo_result(as_json, {"path": str(path), "lines": lines}, f"exported {lines} lines to {path}")


@click.command("import")
@click.argument("path", type=sh.PathParam(exists=True, dir_okay=False, path_type=Path))
@sh.json_option
@click.pass_context
def import_cmd(ctx: click.Context, path: Path, as_json: bool) -> None:
    """Restore a file written by 'memstrata export' into the data dir."""
    state = sh.state(ctx)
    with state.system() as system, heartbeat("import", sys.stderr):
        counts = system.import_(path)
    sh.echo_result(as_json, counts, "imported " + ", ".join(f"{n} {kind}" for kind, n in counts.items()))
    lost = []  # values that live in a running system's memory end with this command's system
    if counts.get("working"):
        lost.append(f"{counts['working']} working-memory value(s)")
    if counts.get("signal") and not state.config.actors.blackboard_snapshot:
        lost.append(f"{counts['signal']} blackboard value(s) (actors.blackboard_snapshot keeps boards)")
    if lost:
        click.echo(
            sh.warning_line(
                f"{' and '.join(lost)} lasted only while this command ran: import them into the "
                "running system that uses them (its import operation, or MemorySystem.import_)"
            ),
            err=True,
        )


@click.command()
@click.pass_context
def demo(ctx: click.Context) -> None:
    """Run the multi-agent simulation (real model, real storage) and print a summary."""
    from memstrata._demo import run_demo

    state = sh.state(ctx)
    run_demo(state.config.data_dir, out=click.echo, config=state.config, embedder=state.embedder)


COMMANDS: tuple[click.Command, ...] = (
    store,
    query,
    remember,
    recall,
    index,
    search,
    get,
    watch,
    status,
    export_cmd,
    import_cmd,
    demo,
    cluster,
)
