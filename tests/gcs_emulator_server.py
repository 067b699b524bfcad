"""gcp-storage-emulator with two pieces of the GCS JSON API it lacks and tensorstore relies on
(orbax writes its OCDBT checkpoints through tensorstore, which commits a manifest with
compare-and-swap):

- media downloads carry the object's generation in `x-goog-generation` (real GCS sends it; without
  it tensorstore reports "Malformed StorageGeneration");
- uploads honour the `ifGenerationMatch` precondition (0: only if absent), answering 412 when it
  fails, as GCS does.

Everything else is the emulator as published. Run: python tests/gcs_emulator_server.py start ...
(the emulator's own command-line arguments).
"""
from __future__ import annotations

import sys
from http import HTTPStatus

from gcp_storage_emulator import server
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

_download, _insert = objects.download, objects.insert


def _current_generation(storage, bucket: str, name: str) -> str | None:
    try:
        return str(storage.get_file_obj(bucket, name)["generation"])
    except NotFound:
        return None


def download(request, response, storage, *args, **kwargs):
    _download(request, response, storage, *args, **kwargs)
    generation = _current_generation(storage, request.params["bucket_name"], request.params["object_id"])
    if generation is not None and response.status in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT):
        response["x-goog-generation"] = generation
        response["x-goog-metageneration"] = "1"


def insert(request, response, storage, *args, **kwargs):
    match = request.query.get("ifGenerationMatch")
    if match:
        name = (request.query.get("name") or [None])[0]
        if name is None and isinstance(request.data, dict):
            name = (request.data.get("meta") or {}).get("name")
        current = _current_generation(storage, request.params["bucket_name"], name) if name else None
        wanted = match[0]
        if (wanted == "0" and current is not None) or (wanted != "0" and current != wanted):
            response.status = HTTPStatus.PRECONDITION_FAILED
            response.json({"error": {"code": 412, "message": "At least one of the pre-conditions you specified "
                                                             "did not hold."}})
            return
    return _insert(request, response, storage, *args, **kwargs)


objects.download, objects.insert = download, insert  # objects.get and the router look them up by name
for _, methods in server.HANDLERS:
    for method, handler in list(methods.items()):
        if handler is _download:
            methods[method] = download
        elif handler is _insert:
            methods[method] = insert

if __name__ == "__main__":
    from gcp_storage_emulator.__main__ import main
    sys.exit(main(sys.argv[1:]))
