"""A small stand-in for the Hugging Face Hub, served on 127.0.0.1 for tests.

It speaks just enough of the Hub's HTTP API for the real `huggingface_hub` client to create repos, upload folders,
list trees and download files (so `from_pretrained(repo_id)` works against it):

- `POST /api/repos/create`, `GET /api/whoami-v2`, `POST /api/validate-yaml`
- `POST /api/{type}s/{repo}/preupload/{rev}`: every file is "regular", so the client inlines the bytes (base64) in
- `POST /api/{type}s/{repo}/commit/{rev}`: an NDJSON body of header, `file`, `deletedFile` and `deletedFolder` lines
- `GET /api/{type}s/{repo}[/revision/{rev}]` (repo info) and `GET /api/{type}s/{repo}/tree/{rev}[/{path}]`
- `HEAD`/`GET /[{type}s/]{repo}/resolve/{rev}/{path}` with `ETag`, `X-Repo-Commit` and `Content-Length`

Repos keep a git-like history: each commit has a 40-hex id, a parent and a full snapshot of the file tree
(path -> git blob id); blob contents live in a temporary folder. Writes need `Authorization: Bearer <token>` with
the server's token; every request is recorded (method, path, headers, status) so tests can check what the client
sent. `fail_commits` makes commits fail, to test code that must survive a failing Hub.

The client reads `HF_ENDPOINT` once, when `huggingface_hub` is imported: whatever talks to this server should run in
a subprocess whose environment comes from `LocalHub.client_env`.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import re
import secrets
import shutil
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit


DEFAULT_BRANCH = "main"
# What a new repo on the Hub starts with, so an "empty" repo already has a commit (and a sha in its info).
INITIAL_FILES = {".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"}
REPO_TYPES = ("model", "dataset", "space")


def git_blob_id(content: bytes) -> str:
    """The id git gives a file's content; the client sends the same value as a file's `oid`."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclasses.dataclass
class Commit:
    oid: str
    parent: str | None
    message: str
    files: dict[str, str]  # full tree snapshot: path -> blob id
    date: str


@dataclasses.dataclass
class Repo:
    repo_id: str
    repo_type: str
    private: bool
    commits: dict[str, Commit] = dataclasses.field(default_factory=dict)
    branches: dict[str, str] = dataclasses.field(default_factory=dict)  # branch name -> commit id

    def resolve(self, revision: str) -> Commit | None:
        """A branch name or a (full or at least 7-char abbreviated) commit id."""
        if revision in self.branches:
            return self.commits[self.branches[revision]]
        if re.fullmatch(r"[0-9a-f]{7,40}", revision):
            matches = [oid for oid in self.commits if oid.startswith(revision)]
            if len(matches) == 1:
                return self.commits[matches[0]]
        return None


@dataclasses.dataclass
class RecordedRequest:
    method: str
    path: str  # with the query string
    headers: dict[str, str]  # names lowercased
    status: int | None = None  # filled in once answered


class HubError(Exception):
    """An error answer: HTTP status, message and the `X-Error-Code` the client maps to an exception type."""

    def __init__(self, status: int, message: str, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}


class LocalHub:
    """The server and its state. Use as a context manager, or call `start()` and `stop()`."""

    def __init__(self, token: str | None = None, user: str = "tester"):
        # Looks like a real token (prefix `hf_`) so that token-scrubbing code treats it as one.
        self.token = token or "hf_test" + secrets.token_hex(16)
        self.user = user
        self.requests: list[RecordedRequest] = []
        self.echo_auth_in_errors = False  # a deliberately careless server, to test that callers scrub tokens
        self._repos: dict[tuple[str, str], Repo] = {}
        self._lock = threading.RLock()
        self._commit_failures_left: int | None = 0  # None: fail every commit
        self._commit_failure_status = 503
        self._commit_failure_retry_after: float | None = None
        self._counter = 0
        self._blob_dir: Path | None = None
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ----------------------------------------------------------------------------------------------- lifecycle

    def start(self) -> LocalHub:
        self._blob_dir = Path(tempfile.mkdtemp(prefix="local-hub-blobs-"))
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="local-hub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._blob_dir is not None:
            shutil.rmtree(self._blob_dir, ignore_errors=True)
            self._blob_dir = None

    def __enter__(self) -> LocalHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def client_env(self, hf_home: str | Path, token: str | None = "default") -> dict[str, str]:
        """Environment variables that point a `huggingface_hub` client in a subprocess at this server.

        Merge into a copy of `os.environ`. `token="default"` passes the server's token as `HF_TOKEN`; `None` leaves
        `HF_TOKEN` out (then remove any inherited one), any other string is passed as is (e.g. a wrong token).
        """
        env = {
            "HF_ENDPOINT": self.url,
            "HF_HOME": str(hf_home),  # a fresh cache: no user token, no cached files leak in
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_OFFLINE": "0",
            "TRANSFORMERS_OFFLINE": "0",
            "NO_PROXY": "127.0.0.1,localhost",  # a proxy set for the machine must not swallow loopback traffic
            "no_proxy": "127.0.0.1,localhost",
        }
        if token is not None:
            env["HF_TOKEN"] = self.token if token == "default" else token
        return env

    # ----------------------------------------------------------------------------------------------- test controls

    def fail_commits(self, n: int | None = None, status: int = 503, retry_after: float | None = 0) -> None:
        """Make the next `n` commits fail with `status` (`n=None`: all of them; `n=0`: stop failing).

        `retry_after` is sent as `Retry-After`; the client honours it (plus one second) instead of its own
        1-2-4-8-8 s backoff on 5xx answers, so `0` keeps a test that fails commits short.
        """
        with self._lock:
            self._commit_failures_left = n
            self._commit_failure_status = status
            self._commit_failure_retry_after = retry_after

    def repo_files(self, repo_id: str, revision: str = DEFAULT_BRANCH, repo_type: str = "model") -> dict[str, bytes]:
        """The files of a repo at a revision: path -> content. Empty if the repo or revision does not exist."""
        with self._lock:
            repo = self._repos.get((repo_type, repo_id))
            commit = repo.resolve(revision) if repo else None
            if commit is None:
                return {}
            return {path: self._read_blob(blob) for path, blob in commit.files.items()}

    def commits(self, repo_id: str, revision: str = DEFAULT_BRANCH, repo_type: str = "model") -> list[Commit]:
        """The history of a revision, newest first."""
        with self._lock:
            repo = self._repos.get((repo_type, repo_id))
            history, commit = [], repo.resolve(revision) if repo else None
            while commit is not None:
                history.append(commit)
                commit = repo.commits.get(commit.parent) if commit.parent else None
            return history

    def repo_is_private(self, repo_id: str, repo_type: str = "model") -> bool | None:
        with self._lock:
            repo = self._repos.get((repo_type, repo_id))
            return None if repo is None else repo.private

    def recorded(self, method: str | None = None, path_contains: str = "") -> list[RecordedRequest]:
        with self._lock:
            return [
                r for r in self.requests if (method is None or r.method == method) and path_contains in r.path
            ]

    # ----------------------------------------------------------------------------------------------- storage

    def _store_blob(self, content: bytes) -> str:
        blob = git_blob_id(content)
        path = self._blob_dir / blob
        if not path.exists():
            path.write_bytes(content)
        return blob

    def _read_blob(self, blob: str) -> bytes:
        return (self._blob_dir / blob).read_bytes()

    def _blob_size(self, blob: str) -> int:
        return (self._blob_dir / blob).stat().st_size

    def _new_commit(self, repo: Repo, branch: str, message: str, files: dict[str, str]) -> Commit:
        parent = repo.branches.get(branch)
        self._counter += 1
        seed = json.dumps([repo.repo_id, parent, message, sorted(files.items()), self._counter, time.time()])
        commit = Commit(
            oid=hashlib.sha1(seed.encode()).hexdigest(),
            parent=parent,
            message=message,
            files=dict(files),
            date=time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()),
        )
        repo.commits[commit.oid] = commit
        repo.branches[branch] = commit.oid
        return commit

    # ----------------------------------------------------------------------------------------------- endpoints

    def create_repo(self, body: dict) -> tuple[int, dict]:
        name, organization = body.get("name"), body.get("organization") or self.user
        repo_type = body.get("type") or "model"
        if not name or repo_type not in REPO_TYPES:
            raise HubError(400, "Invalid repo name or type.")
        repo_id = f"{organization}/{name}"
        private = body.get("visibility") == "private" or body.get("private") is True
        url = self._repo_url(repo_type, repo_id)
        with self._lock:
            if (repo_type, repo_id) in self._repos:
                # The client reads `url` from this body when called with exist_ok=True.
                return 409, {"error": "You already created this model repo", "url": url}
            repo = Repo(repo_id=repo_id, repo_type=repo_type, private=private)
            self._repos[(repo_type, repo_id)] = repo
            self._new_commit(repo, DEFAULT_BRANCH, "initial commit",
                             {path: self._store_blob(data) for path, data in INITIAL_FILES.items()})
        return 200, {"url": url, "name": repo_id, "id": repo_id}

    def preupload(self, repo: Repo, revision: str, body: dict) -> dict:
        commit = self._existing_commit(repo, revision)
        return {
            "files": [
                {
                    "path": f["path"],
                    "uploadMode": "regular",  # bytes travel inline in the commit: no LFS, no Xet
                    "shouldIgnore": False,
                    "oid": commit.files.get(f["path"]),  # lets the client skip unchanged files
                }
                for f in body.get("files", [])
            ]
        }

    def commit(self, repo: Repo, branch: str, ndjson: bytes) -> dict:
        with self._lock:
            if self._commit_failures_left is None or self._commit_failures_left > 0:
                if self._commit_failures_left:
                    self._commit_failures_left -= 1
                headers = {}
                if self._commit_failure_retry_after is not None:
                    headers["Retry-After"] = str(self._commit_failure_retry_after)
                raise HubError(self._commit_failure_status, "Commit failed (simulated Hub outage).", headers=headers)
            if branch not in repo.branches:
                raise HubError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
            files = dict(repo.commits[repo.branches[branch]].files)
            message = ""
            for line in ndjson.splitlines():
                if not line.strip():
                    continue
                item = json.loads(line)
                key, value = item.get("key"), item.get("value", {})
                if key == "header":
                    message = value.get("summary", "")
                    parent = value.get("parentCommit")
                    if parent and not repo.branches[branch].startswith(parent):
                        raise HubError(412, "A commit has happened since. Please refresh and try again.")
                elif key == "file":
                    if value.get("encoding") != "base64":
                        raise HubError(400, f"Unsupported encoding {value.get('encoding')!r}.")
                    files[_clean_path(value["path"])] = self._store_blob(base64.b64decode(value["content"]))
                elif key == "deletedFile":
                    if files.pop(_clean_path(value["path"]), None) is None:
                        raise HubError(404, f"File not found: {value['path']}", "EntryNotFound")
                elif key == "deletedFolder":
                    prefix = _clean_path(value["path"]).rstrip("/") + "/"
                    for path in [p for p in files if p.startswith(prefix)]:
                        del files[path]
                else:  # lfsFile and copies are never asked for: preupload says "regular" for every file
                    raise HubError(400, f"This test Hub does not support {key!r} operations.")
            commit = self._new_commit(repo, branch, message, files)
        return {
            "success": True,
            "commitOid": commit.oid,
            "commitUrl": f"{self._repo_url(repo.repo_type, repo.repo_id)}/commit/{commit.oid}",
            "pullRequestUrl": None,
        }

    def repo_info(self, repo: Repo, revision: str) -> dict:
        commit = self._existing_commit(repo, revision)
        return {
            "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "author": repo.repo_id.split("/")[0],
            "sha": commit.oid,
            "lastModified": commit.date,
            "createdAt": repo.commits[next(iter(repo.commits))].date,
            "private": repo.private,
            "disabled": False,
            "gated": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": [
                {"rfilename": path, "blobId": blob, "size": self._blob_size(blob)}
                for path, blob in sorted(commit.files.items())
            ],
            "usedStorage": sum(self._blob_size(blob) for blob in set(commit.files.values())),
        }

    def tree(self, repo: Repo, revision: str, folder: str, recursive: bool) -> list[dict]:
        commit = self._existing_commit(repo, revision)
        prefix = folder.strip("/") + "/" if folder.strip("/") else ""
        entries: dict[str, dict] = {}
        for path, blob in sorted(commit.files.items()):
            if not path.startswith(prefix):
                continue
            parts = path[len(prefix):].split("/")
            # Every folder between `folder` and the file, or only the first one when not recursive.
            for depth in range(1, len(parts) if recursive else min(2, len(parts))):
                sub = prefix + "/".join(parts[:depth])
                entries.setdefault(sub, {"type": "directory", "oid": git_blob_id(sub.encode()), "size": 0,
                                         "path": sub})
            if recursive or len(parts) == 1:
                entries[path] = {"type": "file", "oid": blob, "size": self._blob_size(blob), "path": path}
        if prefix and not entries:
            raise HubError(404, f"Entry not found: {folder}", "EntryNotFound")
        return list(entries.values())

    def resolve_file(self, repo: Repo, revision: str, path: str) -> tuple[Commit, str]:
        commit = self._existing_commit(repo, revision)
        blob = commit.files.get(_clean_path(path))
        if blob is None:
            raise HubError(404, "Entry not found", "EntryNotFound")
        return commit, blob

    # ----------------------------------------------------------------------------------------------- helpers

    def _repo_url(self, repo_type: str, repo_id: str) -> str:
        return f"{self.url}/{repo_id}" if repo_type == "model" else f"{self.url}/{repo_type}s/{repo_id}"

    def _existing_commit(self, repo: Repo, revision: str) -> Commit:
        commit = repo.resolve(revision)
        if commit is None:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return commit

    def _lookup_repo(self, repo_type: str, repo_id: str, auth: str, write: bool) -> Repo:
        if write and auth != "ok":
            raise HubError(401, "Invalid credentials in Authorization header" if auth == "bad"
                           else "You must be authenticated to write to a repo.")
        with self._lock:
            repo = self._repos.get((repo_type, repo_id))
        if repo is None:
            raise HubError(404, "Repository not found", "RepoNotFound")
        if repo.private and auth != "ok":
            # Like the Hub: a private repo one may not see does not exist, as far as the answer goes.
            raise HubError(401, "Repository not found", "RepoNotFound")
        return repo


def _clean_path(path: str) -> str:
    path = path.strip("/")
    if not path or any(part in ("", ".", "..") for part in path.split("/")):
        raise HubError(400, f"Invalid path in repo: {path!r}")
    return path


# Paths of the API; a repo id is always "namespace/name".
_API = re.compile(r"^/api/(?P<type>models|datasets|spaces)/(?P<repo>[^/]+/[^/]+)(?P<rest>/.*)?$")
_RESOLVE = re.compile(r"^/(?:(?P<type>datasets|spaces)/)?(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")


def _make_handler(hub: LocalHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the client expects; every answer carries Content-Length
        timeout = 60

        def log_message(self, format, *args):  # quiet: the tests read `hub.requests` instead
            pass

        def do_GET(self):
            self._handle()

        def do_HEAD(self):
            self._handle()

        def do_POST(self):
            self._handle()

        def do_PUT(self):
            self._handle()

        def do_DELETE(self):
            self._handle()

        # ------------------------------------------------------------------------------------------- dispatch

        def _handle(self):
            record = RecordedRequest(self.command, self.path, {k.lower(): v for k, v in self.headers.items()})
            with hub._lock:
                hub.requests.append(record)
            body = self._read_body()  # always drained, so a keep-alive connection stays in step
            try:
                status, payload, headers = self._route(body)
            except HubError as e:
                message = e.message
                if hub.echo_auth_in_errors and self.headers.get("Authorization"):
                    # In the body only: the client puts it in its exception text, the place callers must scrub.
                    message += f" (received: {self.headers['Authorization']})"
                status, payload = e.status, {"error": message}
                headers = {**e.headers, "X-Error-Message": e.message}
                if e.code:
                    headers["X-Error-Code"] = e.code
            except Exception as e:  # a bug in this server: answer 500 rather than hang the client
                status, payload, headers = 500, {"error": f"local hub error: {e!r}"}, {}
            record.status = status
            self._send(status, payload, headers)

        def _route(self, body: bytes) -> tuple[int, object, dict]:
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            auth = self._auth()
            method = self.command
            if auth == "bad":
                raise HubError(401, "Invalid credentials in Authorization header")

            if url.path == "/api/whoami-v2" and method == "GET":
                if auth != "ok":
                    raise HubError(401, "Invalid credentials in Authorization header")
                return 200, {"type": "user", "name": hub.user, "orgs": [],
                             "auth": {"type": "access_token", "accessToken": {"role": "write"}}}, {}
            if url.path == "/api/repos/create" and method == "POST":
                if auth != "ok":
                    raise HubError(401, "You must be authenticated to create a repo.")
                status, payload = hub.create_repo(json.loads(body or b"{}"))
                return status, payload, {}
            if url.path == "/api/validate-yaml" and method == "POST":
                return 200, {"errors": [], "warnings": []}, {}

            match = _API.match(url.path)
            if match:
                repo_type = match["type"][:-1]
                rest = match["rest"] or ""
                parts = [unquote(p) for p in rest.split("/")[1:]]
                if method == "POST" and len(parts) == 2 and parts[0] in ("preupload", "commit"):
                    repo = hub._lookup_repo(repo_type, match["repo"], auth, write=True)
                    if parts[0] == "preupload":
                        return 200, hub.preupload(repo, parts[1], json.loads(body or b"{}")), {}
                    return 200, hub.commit(repo, parts[1], body), {}
                if method == "GET":
                    repo = hub._lookup_repo(repo_type, match["repo"], auth, write=False)
                    if not parts:
                        return 200, hub.repo_info(repo, DEFAULT_BRANCH), {}
                    if parts[0] == "revision" and len(parts) == 2:
                        return 200, hub.repo_info(repo, parts[1]), {}
                    if parts[0] == "tree" and len(parts) >= 2:
                        recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
                        return 200, hub.tree(repo, parts[1], "/".join(parts[2:]), recursive), {}

            match = _RESOLVE.match(url.path)
            if match and method in ("GET", "HEAD"):
                repo_type = (match["type"] or "models")[:-1]
                repo = hub._lookup_repo(repo_type, match["repo"], auth, write=False)
                commit, blob = hub.resolve_file(repo, unquote(match["rev"]), unquote(match["path"]))
                return 200, hub._read_blob(blob), {
                    "ETag": f'"{blob}"',
                    "X-Repo-Commit": commit.oid,
                    "Content-Type": "application/octet-stream",
                    "Accept-Ranges": "bytes",
                }
            raise HubError(404, f"This test Hub does not serve {method} {url.path}")

        # ------------------------------------------------------------------------------------------- plumbing

        def _auth(self) -> str:
            """'ok' (the server's token), 'bad' (another token) or 'missing'."""
            header = self.headers.get("Authorization")
            if not header:
                return "missing"
            scheme, _, value = header.partition(" ")
            return "ok" if scheme.lower() == "bearer" and secrets.compare_digest(value.strip(), hub.token) else "bad"

        def _read_body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass  # trailers
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def _send(self, status: int, payload: object, headers: dict) -> None:
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            start, end = 0, len(data)
            range_header = self.headers.get("Range")
            if status == 200 and isinstance(payload, bytes) and range_header:
                wanted = re.fullmatch(r"bytes=(\d*)-(\d*)", range_header.strip())
                if wanted and (wanted[1] or wanted[2]):  # resumed downloads ask for the rest of a file
                    start = int(wanted[1]) if wanted[1] else max(0, len(data) - int(wanted[2]))
                    end = min(len(data), int(wanted[2]) + 1) if wanted[1] and wanted[2] else len(data)
                    status = 206
                    headers = {**headers, "Content-Range": f"bytes {start}-{end - 1}/{len(data)}"}
            self.send_response(status)
            if not isinstance(payload, bytes):
                self.send_header("Content-Type", "application/json")
            for name, value in headers.items():
                self.send_header(name, quote(value, safe=" /:;,=\"'()!*+-._~@?"))  # header values must be latin-1
            self.send_header("Content-Length", str(end - start))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data[start:end])

    return Handler
