"""A small Hugging Face Hub on 127.0.0.1 for tests: the file protocol huggingface_hub's own
client speaks (read from huggingface_hub 2.4's hf_api.py, file_download.py and utils/_http.py),
over repos the test writes into folders.

- GET  /api/models/{repo}/revision/{rev}        model_info / repo_info: id, sha, siblings
- GET  /api/models/{repo}/tree/{rev}            list_repo_tree: files, LFS ones with sha256
- HEAD /{repo}/resolve/{rev}/{file}             X-Repo-Commit, ETag (git blob sha1, or
                                                X-Linked-Etag sha256 + X-Linked-Size for LFS)
- GET  /{repo}/resolve/{rev}/{file}             the bytes; `Range: bytes=N-` answers 206

Errors as the Hub gives them: 404 with X-Error-Code RepoNotFound, RevisionNotFound or
EntryNotFound; a gated repo's files 401 (no token) or 403 (a token without access) with
X-Error-Code GatedRepo; a private repo 401 RepoNotFound without a token that can read it; any
unknown token 401 "Invalid credentials in Authorization header". A repo marked `breaks` sends
3/4 of a weights file and hangs up, the first time; then it serves the rest to the client's
`Range` request, or answers 500 while `down` is set (the Hub is gone).
"""
from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt", ".ckpt")
GRANTED, NOT_GRANTED = "hf_granted_token", "hf_valid_token_without_access"


@dataclass
class Repo:
    files: dict[str, bytes]
    gated: bool = False
    private: bool = False
    breaks: bool = False  # the first GET of a weights file breaks off 3/4 of the way
    broken: set[str] = field(default_factory=set)  # the files that broke off (clear: again)

    @property
    def commit(self) -> str:
        digest = hashlib.sha1()
        for name in sorted(self.files):
            digest.update(name.encode() + b"\0" + hashlib.sha256(self.files[name]).digest())
        return digest.hexdigest()


def blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Hub:
    repos: dict[str, Repo] = field(default_factory=dict)
    down: bool = False  # after a break, a `breaks` repo's weights answer 500
    requests: list[tuple[str, str, Optional[str]]] = field(default_factory=list)
    url: str = ""

    def add(self, repo_id: str, folder: Path, **flags) -> Repo:
        files = {p.relative_to(folder).as_posix(): p.read_bytes()
                 for p in sorted(folder.rglob("*")) if p.is_file()}
        self.repos[repo_id] = Repo(files, **flags)
        return self.repos[repo_id]


class _Handler(BaseHTTPRequestHandler):
    hub: Hub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _reply(self, status: int, headers: dict[str, str], data: bytes = b"",
               body: bool = True) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", headers.get("Content-Length", str(len(data))))
        self.end_headers()
        if body and data:
            self.wfile.write(data)

    def _error(self, status: int, code: Optional[str] = None, message: str = "",
               body: bool = True) -> None:
        headers = {"Content-Type": "application/json"}
        if code:
            headers["X-Error-Code"] = code
        if message:
            headers["X-Error-Message"] = message
        self._reply(status, headers, json.dumps({"error": message or code}).encode(), body)

    def _find(self, parts: list[str]) -> tuple[Optional[str], list[str]]:
        """The repo named by the first one or two parts of a path, and the rest."""
        for n in (2, 1):
            if "/".join(parts[:n]) in self.hub.repos:
                return "/".join(parts[:n]), parts[n:]
        return None, parts[2:]

    def _serve(self, body: bool) -> None:
        hub = self.hub
        path = urlsplit(self.path).path
        parts = [unquote(p) for p in path.strip("/").split("/")]
        hub.requests.append((self.command, path, self.headers.get("Range")))
        auth = self.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
        if token is not None and token not in (GRANTED, NOT_GRANTED):
            return self._error(401, message="Invalid credentials in Authorization header",
                               body=body)
        api = parts[:2] == ["api", "models"]
        repo_id, rest = self._find(parts[2:] if api else parts)
        if repo_id is None or (hub.repos[repo_id].private and token != GRANTED):
            return self._error(401 if token is None else 404, "RepoNotFound",
                               "Repository not found", body)
        repo = hub.repos[repo_id]
        if len(rest) < 2 or rest[0] not in (("revision", "tree") if api else ("resolve",)):
            return self._error(404, message="Not found", body=body)
        if rest[1] not in ("main", repo.commit):
            return self._error(404, "RevisionNotFound", "Invalid rev id", body)
        if api and rest[0] == "revision":
            doc = {"id": repo_id, "modelId": repo_id, "sha": repo.commit, "private": repo.private,
                   "gated": "manual" if repo.gated else False,
                   "siblings": [{"rfilename": name} for name in repo.files]}
            return self._reply(200, {"Content-Type": "application/json"},
                               json.dumps(doc).encode(), body)
        if api:  # the tree, one page
            entries = []
            for name, data in repo.files.items():
                entry = {"type": "file", "path": name, "size": len(data), "oid": blob_sha1(data)}
                if name.endswith(LFS_SUFFIXES):
                    entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                                    "pointerSize": 134}
                entries.append(entry)
            return self._reply(200, {"Content-Type": "application/json"},
                               json.dumps(entries).encode(), body)
        name = "/".join(rest[2:])
        if repo.gated and token != GRANTED:
            return self._error(401 if token is None else 403, "GatedRepo",
                               "Access to this model is restricted", body)
        if name not in repo.files:
            return self._error(404, "EntryNotFound", "Entry not found", body)
        data = repo.files[name]
        headers = {"X-Repo-Commit": repo.commit, "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        lfs = name.endswith(LFS_SUFFIXES)
        if lfs:
            headers.update({"X-Linked-Etag": f'"{hashlib.sha256(data).hexdigest()}"',
                            "X-Linked-Size": str(len(data)),
                            "ETag": f'"{hashlib.sha256(data).hexdigest()}"'})
        else:
            headers["ETag"] = f'"{blob_sha1(data)}"'
        if not body:
            headers["Content-Length"] = str(len(data))
            return self._reply(200, headers, body=False)
        start = 0
        wanted = self.headers.get("Range")
        if wanted and wanted.startswith("bytes="):
            start = int(wanted[len("bytes="):].split("-")[0])
        if repo.breaks and lfs and name not in repo.broken:
            repo.broken.add(name)
            self.send_response(200)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[start:start + (len(data) - start) * 3 // 4])
            self.wfile.flush()
            self.close_connection = True
            return
        if repo.breaks and lfs and hub.down:  # the Hub is gone for the rest of this run
            return self._error(500, message="Internal Error")
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            return self._reply(206, headers, data[start:])
        return self._reply(200, headers, data)


class HubServer:
    """`with HubServer(hub) as url:` serves `hub` on 127.0.0.1 at a free port."""

    def __init__(self, hub: Hub):
        handler = type("Handler", (_Handler,), {"hub": hub})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        hub.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.hub = hub
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        return self.hub.url

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
