"""docker/nginx.conf against the app it fronts: each route's body limit, the body deadline, request
buffering, and the error shape of what nginx answers itself. nginx refused valid `/similar` bodies
(its 1m under the route's 1,552,384 bytes), and streamed slow bodies through to the replicas.

The config is parsed here (a small reader of nginx's syntax, enough for this file), and, where
nginx is installed, checked by `nginx -t`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from app.config import Settings
from app.schemas import BODY_LIMITS

CONF = Path(__file__).resolve().parents[1] / "docker" / "nginx.conf"
UPSTREAM = "http://app"


@dataclass
class Block:
    """A block's directives (name -> each occurrence's arguments) and the blocks inside it."""

    args: list[str] = field(default_factory=list)
    directives: dict[str, list[list[str]]] = field(default_factory=dict)
    blocks: list[tuple[str, Block]] = field(default_factory=list)

    def one(self, name: str) -> list[str] | None:
        found = self.directives.get(name, [])
        assert len(found) <= 1, f"{name} set {len(found)} times in one block"
        return found[0] if found else None

    def block(self, name: str, *args: str) -> Block:
        matches = [b for n, b in self.blocks if n == name and b.args == list(args)]
        assert len(matches) == 1, f"{name} {' '.join(args)}: {len(matches)} blocks"
        return matches[0]


TOKEN = re.compile(r"""'((?:[^'\\]|\\.)*)'|"((?:[^"\\]|\\.)*)"|([{};])|([^\s{};'"]+)""")


def parse(text: str) -> Block:
    text = re.sub(r"(?m)(^|\s)#.*$", r"\1", text)  # comments (no '#' inside this file's strings)
    stack, words = [Block()], []
    for match in TOKEN.finditer(text):
        single, double, punct, word = match.groups()
        if punct is None:
            words.append(word if word is not None else (single if single is not None else double))
        elif punct == ";":
            stack[-1].directives.setdefault(words[0], []).append(words[1:])
            words = []
        elif punct == "{":
            child = Block(args=words[1:])
            stack[-1].blocks.append((words[0], child))
            stack.append(child)
            words = []
        else:
            assert not words, f"unterminated directive {words}"
            stack.pop()
    assert len(stack) == 1 and not words, "unbalanced braces"
    return stack[0]


def size(value: str) -> int:
    """nginx's size syntax: bytes, or k/m/g."""
    number, unit = re.fullmatch(r"(\d+)([kKmMgG]?)", value).groups()  # type: ignore[union-attr]
    return int(number) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[unit.lower()]


def seconds(value: str) -> float:
    number, unit = re.fullmatch(r"(\d+)(ms|s|m)?", value).groups()  # type: ignore[union-attr]
    return int(number) * {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}[unit]


@pytest.fixture(scope="module")
def server() -> Block:
    servers = [b for name, b in parse(CONF.read_text()).blocks if name == "server"]
    assert len(servers) == 1
    return servers[0]


def setting(server: Block, location: Block, name: str) -> list[str] | None:
    """A directive as nginx applies it in `location`: its own, else the server's."""
    return location.one(name) or server.one(name)


def test_each_route_takes_the_bodies_the_app_takes_and_no_larger(server: Block) -> None:
    settings = Settings()
    for path, limit in BODY_LIMITS.items():
        location = server.block("location", "=", path)
        assert location.one("proxy_pass") == [UPSTREAM]
        assert size(setting(server, location, "client_max_body_size")[0]) == limit, path  # type: ignore[index]
    rest = server.block("location", "/")
    assert size(setting(server, rest, "client_max_body_size")[0]) == settings.max_body_bytes  # type: ignore[index]
    admin = server.block("location", "/admin/")
    admin_limit = size(setting(server, admin, "client_max_body_size")[0])  # type: ignore[index]
    # A little over the app's: an upload just past it gets the app's 413, which names the limit.
    assert settings.admin_max_body_bytes <= admin_limit <= settings.admin_max_body_bytes + (2 << 20)


def test_bodies_are_read_whole_by_nginx_within_the_apps_deadline(server: Block) -> None:
    """Buffered: a slow body costs nginx a buffer, not a replica's slot; and it must arrive within
    the app's own deadline (nginx's counts the time between two reads, the app's the whole body)."""
    deadline = Settings().body_read_timeout_s
    for args in (("=", "/reply"), ("=", "/similar"), ("/",)):
        location = server.block("location", *args)
        assert setting(server, location, "proxy_request_buffering") in (None, ["on"]), args
        assert seconds(setting(server, location, "client_body_timeout")[0]) == deadline, args  # type: ignore[index]


def test_a_body_over_its_limit_is_refused_by_nginx_in_the_apps_error_shape(server: Block) -> None:
    """nginx answers a body over a route's limit itself: in the app's JSON, naming the body. (A body
    that stops arriving gets no answer from nginx, whatever its error_page: it closes the connection.)"""
    page = [args for args in server.directives.get("error_page", []) if "413" in args[:-1]]
    assert len(page) == 1
    named = server.block("location", page[0][-1])
    assert named.one("default_type") == ["application/json"]
    code, body = named.one("return")  # type: ignore[misc]
    assert int(code) == 413
    error = json.loads(body)["error"]
    assert error["kind"] == "payload_too_large" and error["field"] == "body"
    assert set(error) == {"kind", "message", "field", "details"}


def test_nginx_accepts_the_config(tmp_path: Path) -> None:
    """`nginx -t` on the config, in an http block as the image's nginx.conf includes it. Compose's
    `app` resolves only inside its network, so it is 127.0.0.1 here; an nginx older than 1.27.3
    (Debian 12 has 1.22) has no `resolve` on an upstream server, so that word is dropped for it."""
    nginx = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")  # sbin: not on every PATH
    if nginx is None:
        pytest.skip("nginx is not installed (apt-get install nginx-light)")
    version = subprocess.run([nginx, "-v"], capture_output=True, text=True, check=True).stderr
    major, minor, patch = (int(n) for n in re.search(r"nginx/(\d+)\.(\d+)\.(\d+)", version).groups())  # type: ignore[union-attr]
    text = CONF.read_text().replace("server app:8000", "server 127.0.0.1:8000")
    if (major, minor, patch) < (1, 27, 3):
        text = re.sub(r"(server 127\.0\.0\.1:8000[^;]*?) resolve;", r"\1;", text)
    (tmp_path / "site.conf").write_text(text)
    (tmp_path / "nginx.conf").write_text(
        f"pid {tmp_path}/nginx.pid;\nerror_log stderr;\nevents {{}}\n"
        f"http {{\n  client_body_temp_path {tmp_path}/body;\n  include {tmp_path}/site.conf;\n}}\n"
    )
    checked = subprocess.run(
        [nginx, "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stderr
