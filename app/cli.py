"""chitchat: serve the service, or talk to a running one.

Every subcommand but `serve` and `eval` goes through app.client and prints its result as JSON; a service
error exits 1 with its kind and message on stderr, and `upload` adds there what it skipped and which
duplicates the job resolved. `serve` is the only one that imports the server.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any, cast

from pydantic import BaseModel

from app.client import ChitchatClient, ChitchatError, Job, UploadAccepted
from app.client._base import CONTENT_TYPES, DEFAULT_JOBS, Mode

DEFAULT_URL = "http://127.0.0.1:8000"
STRATEGIES = ("query_similarity", "reply_matching", "reaction")
# As the Makefile's and the Dockerfile's uvicorn lines: in-flight requests get this long to finish on SIGTERM.
GRACEFUL_SHUTDOWN_S = 20
SHOWN = 10  # skipped records, and lines per kind of duplicate, in the upload summary


def _print(result: BaseModel) -> None:
    print(json.dumps(result.model_dump(mode="json", by_alias=True), indent=2, ensure_ascii=False))


def _client(args: argparse.Namespace) -> ChitchatClient:
    return ChitchatClient(args.url, args.token, timeout=args.timeout)


def _shown(call: Callable[[ChitchatClient, argparse.Namespace], BaseModel]) -> Callable[[argparse.Namespace], int]:
    """A subcommand that makes one client call and prints its result as JSON."""

    def run(args: argparse.Namespace) -> int:
        with _client(args) as client:
            _print(call(client, args))
        return 0

    return run


def _reply(args: argparse.Namespace) -> int:
    with _client(args) as client:
        options: dict[str, Any] = {"k": args.k, "strategies": args.strategy, "rerank": args.rerank}
        rule = {"tags_any": args.tag, "tags_all": args.all_tags, "tags_none": args.without_tag}
        rule["language"] = args.language
        options["filter"] = {name: value for name, value in rule.items() if value} or None
        options["exclude_ids"] = args.exclude_id
        options["set_name"] = args.set
        if args.session is not None:
            result = client.reply(session_id=args.session, message=args.text[0], **options)
        else:
            result = client.reply(args.text, **options)
    _print(result)
    return 0


def _upload(args: argparse.Namespace) -> int:
    with _client(args) as client:
        result = client.upload_candidates(
            args.file,
            cast(Mode, args.mode),
            on_invalid=args.on_invalid,
            wait=not args.no_wait,
            progress=not args.no_progress,
            content_type=args.content_type,
            set_name=args.set,
            encoder=args.encoder,
        )
    _print(result)
    for line in _upload_summary(result):
        print(line, file=sys.stderr)
    if isinstance(result, Job) and not result.succeeded:
        print(f"error: job {result.id} {result.state}: {result.error}", file=sys.stderr)
        return 1
    return 0


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _upload_summary(result: Job | UploadAccepted) -> list[str]:
    """What the upload dropped and which duplicates it resolved, for stderr: stdout stays the JSON."""
    if isinstance(result, UploadAccepted):
        if not result.skipped:
            return []
        return [f"skipped {_plural(result.skipped, 'invalid record')}; `chitchat job {result.job_id}` lists them"]
    report = result.report
    summary = []
    skipped = report.get("skipped") or 0
    if skipped:
        summary.append(f"skipped {_plural(skipped, 'invalid record')}:")
        listed = report.get("skipped_records") or []
        summary += [f"  {r.get('field')}: {r.get('reason')}" for r in listed[:SHOWN] if isinstance(r, dict)]
        if len(listed) > SHOWN:
            summary.append(f"  ... {len(listed) - SHOWN} more in `chitchat job {result.id}`")
    for found in (report.get("duplicates") or {}).values():
        if isinstance(found, dict) and found.get("records"):
            numbers = [str(n) for n in found.get("lines", [])[:SHOWN]]
            more = ", ..." if found["records"] > len(numbers) else ""
            summary.append(
                f"{_plural(found['records'], 'duplicate')}, at {', '.join(numbers)}{more}: {found.get('rule')}"
            )
    return summary


def _jobs(args: argparse.Namespace) -> int:
    with _client(args) as client:
        jobs = client.jobs(args.limit, set_name=args.set)
    print(json.dumps([job.model_dump(mode="json") for job in jobs], indent=2, ensure_ascii=False))
    return 0


def _delete_set(args: argparse.Namespace) -> int:
    with _client(args) as client:
        client.delete_set(args.name)
    print(json.dumps({"deleted": args.name}))
    return 0


def _ready(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if args.wait is None:
            readiness = client.ready()
        else:
            try:
                readiness = client.wait_until_ready(timeout=args.wait)
            except TimeoutError as error:
                print(f"error: {error}", file=sys.stderr)
                return 1
    _print(readiness)
    return 0 if readiness.ready else 1


def _serve(args: argparse.Namespace) -> int:
    import uvicorn  # only here: the client subcommands must work without the server's dependencies

    # The service writes one JSON line per request itself (CHITCHAT_ACCESS_LOG): uvicorn's text line on top
    # of it would log every request twice, once in a format log pipelines cannot parse.
    uvicorn.run(
        "app.main:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    return 0


def _eval(args: argparse.Namespace) -> int:
    missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        print(
            f"error: eval needs the training dependencies ({', '.join(missing)} not installed): "
            "run `make install-train`",
            file=sys.stderr,
        )
        return 2
    return subprocess.run([sys.executable, "-m", "models.evaluate", *args.extra], check=False).returncode


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chitchat", description=__doc__.splitlines()[0])
    common = _connection_options(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, run: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[common], help=help, description=help)
        sub.set_defaults(run=run)
        return sub

    _add_serve(commands)
    per_set = [*_add_queries(command), *_add_admin(command)]
    for sub in per_set:
        sub.add_argument("--set", metavar="NAME", help="the candidate set (default: the default set)")
    command("info", _shown(lambda client, _: client.info()), "the served model and index")
    ready = command("ready", _ready, "readiness (exit 1 when not ready)")
    ready.add_argument("--wait", type=float, metavar="SECONDS", help="wait up to this long for the server to be ready")

    # Its options are models.evaluate's (chitchat eval --help shows them): everything after it passes through.
    evaluate = commands.add_parser(
        "eval", help="run python -m models.evaluate (needs `make install-train`)", add_help=False
    )
    evaluate.set_defaults(run=_eval)
    return parser


Command = Callable[[str, Callable[[argparse.Namespace], int], str], argparse.ArgumentParser]


def _connection_options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """--url, --token and --timeout on `parser`, and on the parser it returns, a parent of every client
    subcommand: accepted before or after the subcommand. After it they default to SUPPRESS: a
    subparser's default would overwrite a value given before the subcommand."""
    connection: list[tuple[str, Any, Any, str]] = [
        (
            "--url",
            str,
            os.environ.get("CHITCHAT_URL") or DEFAULT_URL,
            f"service URL (env CHITCHAT_URL, else {DEFAULT_URL})",
        ),
        (
            "--token",
            str,
            os.environ.get("CHITCHAT_ADMIN_TOKEN") or None,
            "admin bearer token (env CHITCHAT_ADMIN_TOKEN)",
        ),
        ("--timeout", float, 10.0, "seconds per request (10)"),
    ]
    common = argparse.ArgumentParser(add_help=False)
    for flag, kind, default, help_text in connection:
        parser.add_argument(flag, type=kind, default=default, help=help_text)
        common.add_argument(flag, type=kind, default=argparse.SUPPRESS, help=help_text)
    return common


def _add_serve(commands: Any) -> None:
    serve = commands.add_parser(
        "serve",
        help="run the service (uvicorn app.main:create_app --factory)",
        description="Run the service. It logs one JSON line per request (CHITCHAT_ACCESS_LOG=false: none); "
        f"on SIGTERM in-flight requests get {GRACEFUL_SHUTDOWN_S} s to finish.",
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.set_defaults(run=_serve)


def _add_queries(command: Command) -> list[argparse.ArgumentParser]:
    """reply and similar; returned, as they take --set."""
    reply = command("reply", _reply, "the best next reply to a conversation")
    reply.add_argument("text", nargs="+", metavar="TEXT", help="the turns, oldest first (quote each turn)")
    reply.add_argument("--session", metavar="ID", help="one TEXT, the new message, in this server-side session")
    reply.add_argument("-k", type=int, help="candidates to return (1-50)")
    reply.add_argument("--strategy", action="append", choices=STRATEGIES, help="allow only these (repeatable)")
    reply.add_argument("--rerank", action=argparse.BooleanOptionalAction, help="rerank with the poly head")
    reply.add_argument("--tag", action="append", metavar="TAG", help="only candidates with one of these (repeatable)")
    reply.add_argument("--all-tags", action="append", metavar="TAG", help="only candidates with all of these")
    reply.add_argument("--without-tag", action="append", metavar="TAG", help="no candidate with any of these")
    reply.add_argument("--language", metavar="CODE", help="only candidates uploaded with this language")
    reply.add_argument("--exclude-id", action="append", metavar="ID", help="never answer with this id (repeatable)")

    similar = command(
        "similar",
        _shown(lambda client, args: client.similar(args.text, k=args.k, set_name=args.set)),
        "the stored queries most similar to TEXT",
    )
    similar.add_argument("text", metavar="TEXT")
    similar.add_argument("-k", type=int, help="matches to return (1-50)")
    return [reply, similar]


def _add_admin(command: Command) -> list[argparse.ArgumentParser]:
    """The admin subcommands; returned, those that take --set."""
    upload = command("upload", _upload, "upload candidates from a file and reindex")
    upload.add_argument("file", metavar="FILE", help=f"records, streamed ({', '.join(CONTENT_TYPES)})")
    upload.add_argument("--mode", choices=("append", "replace", "delete"), default="append")
    upload.add_argument("--on-invalid", choices=("skip",), help="drop invalid records instead of refusing all")
    upload.add_argument("--content-type", help="override the type the extension implies")
    upload.add_argument("--encoder", help="build the set with this shipped encoder (e5, minilm; default: its own)")
    upload.add_argument("--no-wait", action="store_true", help="print the queued job and return")
    upload.add_argument("--no-progress", action="store_true", help="no progress bar while waiting")

    job = command("job", _shown(lambda client, args: client.job(args.job_id)), "a reindex job's state")
    job.add_argument("job_id", metavar="JOB_ID")
    jobs = command("jobs", _jobs, "the most recent reindex jobs, newest first")
    jobs.add_argument("--limit", type=int, default=DEFAULT_JOBS, help=f"at most this many ({DEFAULT_JOBS})")
    index = command(
        "index",
        _shown(lambda client, args: client.index(set_name=args.set)),
        "the serving index version and the versions kept",
    )
    rollback = command(
        "rollback", _shown(lambda client, args: client.rollback(set_name=args.set)), "serve the previous index version"
    )
    command("sets", _shown(lambda client, _: client.sets()), "every candidate set: version, counts, index size")
    delete_set = command("delete-set", _delete_set, "remove a candidate set and its index versions")
    delete_set.add_argument("name", metavar="NAME")
    return [upload, jobs, index, rollback]


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "eval":
        args.extra = extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "reply" and args.session is not None and len(args.text) != 1:
        parser.error("with --session, give one TEXT: the new message")
    run = cast(Callable[[argparse.Namespace], int], args.run)
    try:
        return run(args)
    except ChitchatError as error:
        print(f"error: {error}" + (f" [request {error.request_id}]" if error.request_id else ""), file=sys.stderr)
        for detail in error.details[1:]:
            print(f"  {detail.get('field')}: {detail.get('message')}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as error:  # an unreadable file, an unknown file extension
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
