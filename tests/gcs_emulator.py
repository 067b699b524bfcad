"""A real GCS server on 127.0.0.1 for the storage tests: gcp-storage-emulator (in memory) in a
subprocess on a free port. The clients (gcsfs, tensorstore, google-cloud-storage) reach it
through STORAGE_EMULATOR_HOST; nli_jax.storage points tensorstore there and sends no
credentials when that variable is set."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(buckets=("nli-test-bucket",), cwd=None):
    """(process, url) of a running emulator holding `buckets` (empty)."""
    try:
        import gcp_storage_emulator  # noqa: F401
    except ImportError:
        pytest.skip("gcp-storage-emulator is not installed (pip install -e '.[test]')")
    port = free_port()
    server = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gcs_emulator_server.py")
    proc = subprocess.Popen([sys.executable, server, "start", "--host=127.0.0.1",
                             f"--port={port}", "--in-memory", f"--default-bucket={buckets[0]}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{url}/storage/v1/b/{buckets[0]}", timeout=2):
                break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                raise RuntimeError(f"gcp-storage-emulator did not start on {url}")
            time.sleep(0.2)
    for bucket in buckets[1:]:
        request = urllib.request.Request(f"{url}/storage/v1/b", data=f'{{"name": "{bucket}"}}'.encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(request, timeout=5).read()
    return proc, url


def env(url: str, **extra) -> dict:
    """The environment of a subprocess that uses the emulator (and nothing else of the host's
    GCS settings)."""
    out = {k: v for k, v in os.environ.items()
           if k not in ("TENSORSTORE_GCS_HTTP_URL", "GOOGLE_AUTH_TOKEN_FOR_TESTING", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT")}
    out["STORAGE_EMULATOR_HOST"] = url
    out.update(extra)
    return out


def upload_tree(local_dir: str, url: str) -> None:
    """Every file under a local directory to `url` (gs://bucket/prefix), through nli_jax.storage."""
    from nli_jax import storage
    storage.copytree(local_dir, storage.under(url))


def list_objects(url: str, bucket: str) -> list[str]:
    import json
    with urllib.request.urlopen(f"{url}/storage/v1/b/{bucket}/o", timeout=10) as r:
        return sorted(o["name"] for o in json.load(r).get("items", []))
