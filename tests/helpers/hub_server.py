"""A small stand-in for the Hugging Face Hub on 127.0.0.1: enough of its HTTP API (ROUTES)
for the real `huggingface_hub` client to create repos, commit files, list trees and download
(so `from_pretrained(repo_id)` works).

Repos keep a git-like history: each commit a 40-hex id, a parent and a full snapshot (path -> git blob id);
blobs live in a temporary folder. Writes need the server's token; every request is recorded (when, the bytes
each way) so tests can check what the client sent. Files travel inline in the commit, or from `lfs_from` bytes
by LFS as on the Hub; `throttle` serves file bodies slowly, so a client can be killed mid-download.
The client reads `HF_ENDPOINT` once, on import: talk to this server from a subprocess
whose environment comes from `LocalHub.client_env`.
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
BAD_TOKEN = "Invalid credentials in Authorization header"


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
        matches = [oid for oid in self.commits if oid.startswith(revision)]
        if re.fullmatch(r"[0-9a-f]{7,40}", revision) and len(matches) == 1:
            return self.commits[matches[0]]
        return None


@dataclasses.dataclass
class RecordedRequest:
    method: str
    path: str  # with the query string
    headers: dict[str, str]  # names lowercased
    status: int | None = None  # filled in once answered
    started: float = 0.0  # time.monotonic() when it arrived
    finished: float | None = None  # ... when its answer was sent whole (None: cut off, or not yet)
    received: int = 0  # bytes of its body
    served: int = 0  # bytes of the answer's body written (a client killed mid-file leaves fewer)


class HubError(Exception):
    """An error answer: HTTP status, message and the `X-Error-Code` the client maps to an exception type."""

    def __init__(self, status: int, message: str, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}


@dataclasses.dataclass
class Request:
    """What a route answers: the method, the path's named parts (unquoted), the
    query, the body, the token's state."""

    method: str
    parts: dict[str, str]
    query: dict[str, list[str]]
    body: bytes
    auth: str  # "ok" (the server's token), "bad" (another token) or "missing"

    def json(self) -> dict:
        return json.loads(self.body or b"{}")


class LocalHub:
    """The server and its state. Use as a context manager, or call `start()` and `stop()`."""

    def __init__(self, token: str | None = None, user: str = "tester", lfs_from: int | None = None):
        """`lfs_from`: files of at least this many bytes go up as the Hub takes large files, by LFS (the
        client's batch request, then the raw bytes PUT); None: every file inline in the commit, base64."""
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
        self.lfs_from = lfs_from
        self._lfs: dict[str, str] = {}  # LFS objects uploaded: sha256 -> blob id
        self._bytes_per_second: float | None = None  # None: file bodies as fast as the socket takes them
        self._counter = 0
        self._blob_dir: Path | None = None
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> LocalHub:
        self._blob_dir = Path(tempfile.mkdtemp(prefix="local-hub-blobs-"))
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="local-hub", daemon=True).start()
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

    def client_env(self, hf_home: str | Path, token: str | None = "default",
                   lfs: bool = False) -> dict[str, str]:
        """Environment variables (merge into a copy of os.environ) that point a subprocess's client
        at this server. `token="default"`: the server's token as HF_TOKEN; None: no HF_TOKEN
        (remove an inherited one); else as is. `lfs`: for files of `lfs_from` bytes or more, which go up by
        LFS's basic transfer: this server speaks no Xet, so the client's Xet path is turned off (and with it
        upload_folder's streamed pipeline and its retries: a smaller file goes inline either way)."""
        env = {
            "HF_ENDPOINT": self.url,
            "HF_HOME": str(hf_home),  # a fresh cache: no user token, no cached files leak in
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_OFFLINE": "0",
            "TRANSFORMERS_OFFLINE": "0",
            # a proxy set for the machine must not swallow loopback traffic
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }
        if token is not None:
            env["HF_TOKEN"] = self.token if token == "default" else token
        if lfs:
            env["HF_HUB_DISABLE_XET"] = "1"
        return env

    # ---- test controls

    def fail_commits(self, n: int | None = None, status: int = 503, retry_after: float | None = 0) -> None:
        """The next `n` commits fail with `status` (None: all of them; 0: stop failing). The client waits
        `retry_after` (plus a second) instead of its own 1-2-4-8-8 s backoff, so 0 keeps a test short."""
        with self._lock:
            self._commit_failures_left = n
            self._commit_failure_status = status
            self._commit_failure_retry_after = retry_after

    def throttle(self, bytes_per_second: float | None) -> None:
        """Serve file bodies at about `bytes_per_second` per download (None: at full speed), read at each
        chunk, so a download under way speeds up as soon as it is lifted: a client can be killed mid-file."""
        with self._lock:
            self._bytes_per_second = bytes_per_second

    def put_files(self, repo_id: str, files: dict[str, bytes], message: str = "put by a test",
                  private: bool = False, repo_type: str = "model") -> str:
        """Commits `files` (and the initial ones) as the whole tree of a repo, created if needed, on the
        server's side (no client): a repo shaped as a test wants it. Returns the commit's id."""
        with self._lock:
            repo = self._repos.setdefault((repo_type, repo_id), Repo(repo_id, repo_type, private))
            tree = {**INITIAL_FILES, **files}
            return self._new_commit(repo, DEFAULT_BRANCH, message,
                                    {path: self._store_blob(data) for path, data in tree.items()}).oid

    def repo_files(
        self, repo_id: str, revision: str = DEFAULT_BRANCH, repo_type: str = "model"
    ) -> dict[str, bytes]:
        """The files of a repo at a revision: path -> content. Empty if the repo
        or revision does not exist."""
        with self._lock:
            repo = self._repos.get((repo_type, repo_id))
            commit = repo.resolve(revision) if repo else None
            return {path: self._read_blob(blob) for path, blob in commit.files.items()} if commit else {}

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

    # ---- storage

    def _store_blob(self, content: bytes) -> str:
        blob = git_blob_id(content)
        if not (self._blob_dir / blob).exists():
            (self._blob_dir / blob).write_bytes(content)
        return blob

    def _read_blob(self, blob: str) -> bytes:
        return (self._blob_dir / blob).read_bytes()

    def _blob_size(self, blob: str) -> int:
        return (self._blob_dir / blob).stat().st_size

    def _new_commit(self, repo: Repo, branch: str, message: str, files: dict[str, str]) -> Commit:
        parent = repo.branches.get(branch)
        self._counter += 1
        seed = json.dumps([repo.repo_id, parent, message, sorted(files.items()), self._counter, time.time()])
        commit = Commit(oid=hashlib.sha1(seed.encode()).hexdigest(), parent=parent, message=message,
                        files=dict(files), date=time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()))
        repo.commits[commit.oid] = commit
        repo.branches[branch] = commit.oid
        return commit

    def _repo_url(self, repo_type: str, repo_id: str) -> str:
        return f"{self.url}/{repo_id}" if repo_type == "model" else f"{self.url}/{repo_type}s/{repo_id}"

    def _repo(self, request: Request, write: bool = False) -> Repo:
        """The repo a path names, if the request may see it (or, with `write`, change it)."""
        if write and request.auth != "ok":
            raise HubError(401, "You must be authenticated to write to a repo.")
        with self._lock:
            repo = self._repos.get(((request.parts.get("type") or "models")[:-1], request.parts["repo"]))
        if repo is None:
            raise HubError(404, "Repository not found", "RepoNotFound")
        if repo.private and request.auth != "ok":
            # Like the Hub: a private repo one may not see does not exist, as far as the answer goes.
            raise HubError(401, "Repository not found", "RepoNotFound")
        return repo

    def _commit_of(self, repo: Repo, revision: str) -> Commit:
        commit = repo.resolve(revision)
        if commit is None:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return commit

    # ---- the routes: each takes a Request and returns (status, payload, headers)

    def whoami(self, request: Request):
        if request.auth != "ok":
            raise HubError(401, BAD_TOKEN)
        return 200, {"type": "user", "name": self.user, "orgs": [],
                     "auth": {"type": "access_token", "accessToken": {"role": "write"}}}, {}

    def validate_yaml(self, request: Request):
        return 200, {"errors": [], "warnings": []}, {}

    def create_repo(self, request: Request):
        if request.auth != "ok":
            raise HubError(401, "You must be authenticated to create a repo.")
        body = request.json()
        name, repo_type = body.get("name"), body.get("type") or "model"
        if not name or repo_type not in REPO_TYPES:
            raise HubError(400, "Invalid repo name or type.")
        repo_id = f"{body.get('organization') or self.user}/{name}"
        url = self._repo_url(repo_type, repo_id)
        with self._lock:
            if (repo_type, repo_id) in self._repos:
                # The client reads `url` from this body when called with exist_ok=True.
                return 409, {"error": "You already created this model repo", "url": url}, {}
            private = body.get("visibility") == "private" or body.get("private") is True
            repo = Repo(repo_id=repo_id, repo_type=repo_type, private=private)
            self._repos[repo_type, repo_id] = repo
            self._new_commit(repo, DEFAULT_BRANCH, "initial commit",
                             {path: self._store_blob(data) for path, data in INITIAL_FILES.items()})
        return 200, {"url": url, "name": repo_id, "id": repo_id}, {}

    def preupload(self, request: Request):
        commit = self._commit_of(self._repo(request, write=True), request.parts["rev"])
        # A file "regular" travels inline in the commit, an "lfs" one by the LFS routes (no Xet);
        # the oid lets the client skip unchanged files.
        lfs = self.lfs_from
        return (
            200,
            {
                "files": [
                    {
                        "path": f["path"], "shouldIgnore": False, "oid": commit.files.get(f["path"]),
                        "uploadMode": "lfs" if lfs is not None and f.get("size", 0) >= lfs else "regular",
                    }
                    for f in request.json().get("files", [])
                ]
            },
            {},
        )

    def commit(self, request: Request):
        """An NDJSON body of a header line, then `file`, `deletedFile` and `deletedFolder` lines."""
        repo, branch = self._repo(request, write=True), request.parts["rev"]
        with self._lock:
            if self._commit_failures_left is None or self._commit_failures_left > 0:
                if self._commit_failures_left:
                    self._commit_failures_left -= 1
                retry = self._commit_failure_retry_after
                raise HubError(self._commit_failure_status, "Commit failed (simulated Hub outage).",
                               headers={} if retry is None else {"Retry-After": str(retry)})
            if branch not in repo.branches:
                raise HubError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
            files, message = dict(repo.commits[repo.branches[branch]].files), ""
            for item in (json.loads(line) for line in request.body.splitlines() if line.strip()):
                key, value = item.get("key"), item.get("value", {})
                if key == "header":
                    message, parent = value.get("summary", ""), value.get("parentCommit")
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
                    files = {path: blob for path, blob in files.items() if not path.startswith(prefix)}
                elif key == "lfsFile":
                    if value.get("oid") not in self._lfs:
                        raise HubError(400, f"LFS object {value.get('oid')} was never uploaded.")
                    files[_clean_path(value["path"])] = self._lfs[value["oid"]]
                else:  # copies are never asked for
                    raise HubError(400, f"This test Hub does not support {key!r} operations.")
            commit = self._new_commit(repo, branch, message, files)
        return 200, {"success": True, "commitOid": commit.oid, "pullRequestUrl": None,
                     "commitUrl": f"{self._repo_url(repo.repo_type, repo.repo_id)}/commit/{commit.oid}"}, {}

    def lfs_batch(self, request: Request):
        """Where to PUT each object not stored yet (basic transfer), and where to verify it."""
        self._repo(request, write=True)
        objects = []
        for item in request.json().get("objects", []):
            oid, size = item["oid"], item["size"]
            actions = {} if oid in self._lfs else {"actions": {
                "upload": {"href": f"{self.url}/lfs-objects/{oid}"},
                "verify": {"href": f"{self.url}/lfs-objects/{oid}/verify"}}}
            objects.append({"oid": oid, "size": size, **actions})
        return 200, {"transfer": "basic", "objects": objects}, {}

    def lfs_put(self, request: Request):
        """The raw bytes; a presigned storage URL on the Hub, so no token is asked for."""
        if hashlib.sha256(request.body).hexdigest() != request.parts["oid"]:
            raise HubError(400, "The body does not match its sha256.")
        with self._lock:
            self._lfs[request.parts["oid"]] = self._store_blob(request.body)
        return 200, {}, {}

    def lfs_verify(self, request: Request):
        if request.parts["oid"] not in self._lfs:
            raise HubError(404, "LFS object not found")
        return 200, {}, {}

    def repo_info(self, request: Request):
        repo = self._repo(request)
        commit = self._commit_of(repo, request.parts.get("rev") or DEFAULT_BRANCH)
        return (
            200,
            {
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
            },
            {},
        )

    def tree(self, request: Request):
        commit = self._commit_of(self._repo(request), request.parts["rev"])
        folder = request.parts.get("path") or ""
        recursive = request.query.get("recursive", ["false"])[0].lower() in ("1", "true")
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
        return 200, list(entries.values()), {}

    def resolve_file(self, request: Request):
        commit = self._commit_of(self._repo(request), request.parts["rev"])
        blob = commit.files.get(_clean_path(request.parts["path"]))
        if blob is None:
            raise HubError(404, "Entry not found", "EntryNotFound")
        return (
            200,
            self._read_blob(blob),
            {
                "ETag": f'"{blob}"', "X-Repo-Commit": commit.oid, "Content-Type": "application/octet-stream",
                "Accept-Ranges": "bytes",
            },
        )

    def unserved(self, request: Request) -> None:
        self._repo(request)  # an unknown or hidden repo says so before "not served"


def _clean_path(path: str) -> str:
    path = path.strip("/")
    if not path or any(part in ("", ".", "..") for part in path.split("/")):
        raise HubError(400, f"Invalid path in repo: {path!r}")
    return path


# A repo id is always "namespace/name"; `rev` and `path` are unquoted before a route sees them.
_API = r"/api/(?P<type>models|datasets|spaces)/(?P<repo>[^/]+/[^/]+)"
ROUTES = [  # (methods, path, the LocalHub method that answers), the first answer wins
    ({"GET"}, r"/api/whoami-v2", LocalHub.whoami),
    ({"POST"}, r"/api/repos/create", LocalHub.create_repo),
    ({"POST"}, r"/api/validate-yaml", LocalHub.validate_yaml),
    (
        {"POST"}, r"/(?:(?P<type>datasets|spaces)/)?(?P<repo>[^/]+/[^/]+)\.git/info/lfs/objects/batch",
        LocalHub.lfs_batch,
    ),
    ({"PUT"}, r"/lfs-objects/(?P<oid>[0-9a-f]{64})", LocalHub.lfs_put),
    ({"POST"}, r"/lfs-objects/(?P<oid>[0-9a-f]{64})/verify", LocalHub.lfs_verify),
    ({"POST"}, _API + r"/preupload/(?P<rev>[^/]+)", LocalHub.preupload),
    ({"POST"}, _API + r"/commit/(?P<rev>[^/]+)", LocalHub.commit),
    ({"GET"}, _API + r"(?:/revision/(?P<rev>[^/]+))?", LocalHub.repo_info),
    ({"GET"}, _API + r"/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?", LocalHub.tree),
    ({"GET"}, _API + r"/.*", LocalHub.unserved),
    (
        {"GET", "HEAD"},
        r"/(?:(?P<type>datasets|spaces)/)?(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)",
        LocalHub.resolve_file,
    ),
]


def _make_handler(hub: LocalHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # keep-alive, as the client expects; every answer carries Content-Length
        protocol_version = "HTTP/1.1"
        timeout = 60

        def log_message(self, format, *args):  # quiet: the tests read `hub.requests` instead
            pass

        def _handle(self):
            record = RecordedRequest(self.command, self.path, {k.lower(): v for k, v in self.headers.items()},
                                     started=time.monotonic())
            with hub._lock:
                hub.requests.append(record)
            body = self._read_body()  # always drained, so a keep-alive connection stays in step
            record.received = len(body)
            try:
                status, payload, headers = self._route(body)
            except HubError as e:
                message = e.message
                if hub.echo_auth_in_errors and self.headers.get("Authorization"):
                    # In the body only: the client puts it in its exception text, the
                    # place callers must scrub.
                    message += f" (received: {self.headers['Authorization']})"
                status, payload = e.status, {"error": message}
                headers = {
                    **e.headers, "X-Error-Message": e.message, **({"X-Error-Code": e.code} if e.code else {}),
                }
            except Exception as e:  # a bug in this server: answer 500 rather than hang the client
                status, payload, headers = 500, {"error": f"local hub error: {e!r}"}, {}
            record.status = status
            try:
                self._send(status, payload, headers, record)
            except (BrokenPipeError, ConnectionResetError):  # a client killed mid-answer: not our error
                self.close_connection = True
                return
            record.finished = time.monotonic()

        do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _handle

        def _route(self, body: bytes) -> tuple[int, object, dict]:
            url, auth = urlsplit(self.path), self._auth()
            if auth == "bad":
                raise HubError(401, BAD_TOKEN)
            for methods, pattern, answer in ROUTES:
                match = re.fullmatch(pattern, url.path)
                if match and self.command in methods:
                    parts = {
                        name: unquote(value) for name, value in match.groupdict().items() if value is not None
                    }
                    answered = answer(hub, Request(self.command, parts, parse_qs(url.query), body, auth))
                    if answered is not None:
                        return answered
            raise HubError(404, f"This test Hub does not serve {self.command} {url.path}")

        def _auth(self) -> str:
            header = self.headers.get("Authorization")
            if not header:
                return "missing"
            scheme, _, value = header.partition(" ")
            return (
                "ok"
                if scheme.lower() == "bearer" and secrets.compare_digest(value.strip(), hub.token)
                else "bad"
            )

        def _read_body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def _send(self, status: int, payload: object, headers: dict, record: RecordedRequest) -> None:
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
                # header values must be latin-1
                self.send_header(name, quote(value, safe=" /:;,=\"'()!*+-._~@?"))
            self.send_header("Content-Length", str(end - start))
            self.end_headers()
            if self.command != "HEAD":
                self._write_body(data[start:end], isinstance(payload, bytes), record)

        def _write_body(self, body: bytes, is_file: bool, record: RecordedRequest) -> None:
            """In chunks of 16 KiB; a file's at the throttled rate, if one is set."""
            chunk = 16 * 1024
            for at in range(0, len(body), chunk):
                with hub._lock:
                    rate = hub._bytes_per_second if is_file else None
                if rate:
                    time.sleep(min(chunk, len(body) - at) / rate)
                self.wfile.write(body[at:at + chunk])
                record.served += min(chunk, len(body) - at)

    return Handler
