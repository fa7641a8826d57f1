"""Pack store in an S3-compatible object store (AWS S3, MinIO, Ceph RGW, ...), through boto3.

URL: ``s3://BUCKET[/PREFIX][?endpoint_url=URL&region=NAME]``. Key ``K`` is the object
``PREFIX/K`` in ``BUCKET``. ``endpoint_url`` selects a server other than AWS (for example
``http://127.0.0.1:9000``); ``region`` the signing region. Credentials come from boto3's
usual chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, config
files, instance roles) and never from the URL.

What the store relies on: a PUT (single or multipart) makes an object visible only once it
is complete and durable, and conditional PUTs (``If-Match``, ``If-None-Match``: AWS S3 since
2024, MinIO, Ceph RGW) for ``put_if``, so a key is absent or whole (write ordering step 1); reads after a
completed PUT see it (S3 has been strongly read-after-write consistent since 2020; MinIO
and Ceph are too). Ranged GETs serve partial reads. Packs are written to a local staging
folder first and uploaded by ``put_file``; that folder is the caller's choice
(``open_backend`` puts it at ``.ckpt/store/.staging`` of the repository, on the same disk
as the repository) or a private temporary folder.
"""

from __future__ import annotations

import io
import re
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import parse_qs, urlsplit

import boto3
from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore import exceptions as boto_errors
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError

from ckptrepo.errors import StorageError, UsageError
from ckptrepo.storage.base import check_key, check_prefix, check_range, missing, short_read

_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-_]{1,61}[a-z0-9]", re.IGNORECASE)
_QUERY_KEYS = ("endpoint_url", "region")
_MULTIPART = 64 << 20
_TRANSFER = TransferConfig(multipart_threshold=_MULTIPART, multipart_chunksize=16 << 20, max_concurrency=4)
_MISSING_CODES = {"404", "NoSuchKey", "NotFound"}
_NO_BUCKET_CODES = {"NoSuchBucket"}
_PRECONDITION_CODES = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}
_AUTH_CODES = {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"}
_URL_HINT = "Write s3://BUCKET[/PREFIX][?endpoint_url=http://HOST:PORT&region=NAME]."
_CREDENTIALS_HINT = (
    "Set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) for the store; "
    "credentials never go into the store URL."
)


def parse_s3_url(url: str) -> tuple[str, str, str | None, str | None]:
    """``(bucket, prefix, endpoint_url, region)`` of an ``s3://`` URL; UsageError if malformed.

    The prefix has no leading or trailing '/' and follows the key rules (``check_key``).
    """
    parts = urlsplit(url)
    if parts.scheme.lower() != "s3":
        raise UsageError(f"store URL {url!r} is not an s3:// URL", hint=_URL_HINT)
    if "@" in parts.netloc:
        raise UsageError(f"store URL {url!r} holds credentials", hint=_CREDENTIALS_HINT)
    bucket = parts.netloc
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise UsageError(f"store URL {url!r}: {bucket!r} is not a valid bucket name", hint=_URL_HINT)
    if parts.fragment:
        raise UsageError(f"store URL {url!r} has a fragment ('#...')", hint=_URL_HINT)
    prefix = parts.path.strip("/")
    if prefix:
        try:
            check_key(prefix)
        except UsageError as exc:
            raise UsageError(f"store URL {url!r}: invalid prefix {prefix!r} ({exc})", hint=_URL_HINT) from exc
    try:
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as exc:
        raise UsageError(f"store URL {url!r}: malformed query ({exc})", hint=_URL_HINT) from exc
    unknown = sorted(set(query) - set(_QUERY_KEYS))
    if unknown:
        raise UsageError(
            f"store URL {url!r}: unknown parameter(s) {', '.join(unknown)}; known are {', '.join(_QUERY_KEYS)}",
            hint=_URL_HINT,
        )
    values: dict[str, str | None] = {}
    for name in _QUERY_KEYS:
        given = query.get(name, [])
        if len(given) > 1 or given == [""]:
            raise UsageError(f"store URL {url!r}: give {name}= once, with a value", hint=_URL_HINT)
        values[name] = given[0] if given else None
    endpoint = values["endpoint_url"]
    if endpoint is not None:
        ep = urlsplit(endpoint)
        if ep.scheme not in ("http", "https") or not ep.netloc:
            raise UsageError(f"store URL {url!r}: endpoint_url {endpoint!r} is not an http(s) URL", hint=_URL_HINT)
    return bucket, prefix, endpoint, values["region"]


def _code(exc: ClientError) -> str:
    error: dict[str, Any] = exc.response.get("Error", {})
    return str(error.get("Code", ""))


class S3Backend:
    """Objects in ``bucket`` under ``prefix``; see the module docstring for URL and guarantees.

    One boto3 client, made in the constructor, serves every thread (clients are
    thread-safe). The constructor does no network I/O; ``check`` does one request.
    ``staging`` None means a private temporary folder, removed with the instance.
    ``close`` closes the client's connections; the backend stays usable.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        staging: Path | None = None,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        self.region = region
        query = "&".join(f"{k}={v}" for k, v in (("endpoint_url", endpoint_url), ("region", region)) if v)
        self.url = f"s3://{bucket}" + (f"/{self.prefix}" if self.prefix else "") + (f"?{query}" if query else "")
        self._shared_staging = Path(staging).absolute() if staging is not None else None
        self._staging = self._shared_staging
        self._staging_lock = threading.Lock()
        config = Config(
            connect_timeout=5,
            read_timeout=60,
            retries={"max_attempts": 3, "mode": "standard"},
            max_pool_connections=32,
        )
        # A Session is not thread-safe, so a private one makes the client, once.
        session = boto3.session.Session()
        self._client: Any = session.client("s3", endpoint_url=endpoint_url, region_name=region, config=config)

    @classmethod
    def from_url(cls, url: str, staging: Path | None = None) -> S3Backend:
        """The backend an ``s3://`` URL names (see ``parse_s3_url``); no network I/O."""
        bucket, prefix, endpoint, region = parse_s3_url(url)
        return cls(bucket, prefix, endpoint_url=endpoint, region=region, staging=staging)

    @property
    def shared_staging(self) -> Path | None:
        """The staging folder given to the constructor (it may not exist yet), else None."""
        return self._shared_staging

    def _name(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _fail(self, exc: Exception, action: str, key: str | None = None) -> NoReturn:
        """Raise the StorageError (with a hint) for a boto3/botocore failure."""
        what = f"{action} {key!r} in {self.url}" if key is not None else f"{action} {self.url}"
        if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
            raise StorageError(detail=f"cannot {what}: no usable credentials ({exc})", hint=_CREDENTIALS_HINT) from exc
        if isinstance(exc, (boto_errors.ConnectionError, boto_errors.HTTPClientError)):
            raise StorageError(
                detail=f"cannot {what}: endpoint {self.endpoint_url or 'AWS S3'} is unreachable ({exc})",
                hint="Check endpoint_url= in the store URL and that the server is up and reachable.",
            ) from exc
        if isinstance(exc, ClientError):
            code = _code(exc)
            if code in _NO_BUCKET_CODES or (key is None and code in _MISSING_CODES):
                raise StorageError(
                    detail=f"cannot {what}: bucket {self.bucket!r} does not exist",
                    hint="Create the bucket first (e.g. `aws s3 mb s3://BUCKET`), or fix the store URL.",
                ) from exc
            if code in _AUTH_CODES:
                raise StorageError(
                    detail=f"cannot {what}: access denied ({code})",
                    hint="Check the credentials and that they may read, write, list and delete in the bucket.",
                ) from exc
        raise StorageError(detail=f"cannot {what} ({exc})") from exc

    def check(self) -> None:
        """Raise StorageError unless the bucket exists and these credentials reach it."""
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except (BotoCoreError, ClientError) as exc:
            self._fail(exc, "open")

    def staging_dir(self) -> Path:
        with self._staging_lock:
            if self._staging is None:
                self._staging = Path(tempfile.mkdtemp(prefix="ckpt-s3-staging-"))
                weakref.finalize(self, shutil.rmtree, self._staging, True)
            staging = self._staging
        try:
            staging.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(detail=f"cannot create {staging} ({exc})") from exc
        return staging

    def put_file(self, key: str, local_path: Path) -> None:
        name = self._name(key)
        source = Path(local_path)
        try:
            self._client.upload_file(str(source), self.bucket, name, Config=_TRANSFER)
        except OSError as exc:
            raise StorageError(detail=f"cannot store {key!r} in {self.url} ({exc})") from exc
        except (BotoCoreError, ClientError) as exc:
            self._fail(exc, "store", key)
        except S3UploadFailedError as exc:
            # boto3 re-raises a ClientError of the upload as this, with the original as context.
            cause = exc.__context__
            if isinstance(cause, ClientError):
                self._fail(cause, "store", key)
            raise StorageError(detail=f"cannot store {key!r} in {self.url} ({exc})") from exc
        source.unlink(missing_ok=True)

    def put_bytes(self, key: str, data: bytes | memoryview) -> None:
        name = self._name(key)
        try:
            if len(data) >= _MULTIPART:
                self._client.upload_fileobj(io.BytesIO(data), self.bucket, name, Config=_TRANSFER)
            else:
                self._client.put_object(Bucket=self.bucket, Key=name, Body=bytes(data))
        except (BotoCoreError, ClientError) as exc:
            self._fail(exc, "store", key)

    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        """The bytes and a token: the object's ETag."""
        name = self._name(key)
        response = self._or_none(key, lambda: self._client.get_object(Bucket=self.bucket, Key=name))
        if response is None:
            return None
        return self._read_all(key, response["Body"]), str(response["ETag"])

    def put_if(self, key: str, data: bytes | memoryview, *, expected: str | None) -> str | None:
        """One conditional PUT (objects up to 5 GiB): ``If-None-Match: *`` (create) or
        ``If-Match: <ETag>`` (replace), which the server checks and applies atomically. Refusals
        return None: 412 PreconditionFailed, 409 ConditionalRequestConflict (a conditional write of
        the key in flight: retry), 404 when ``expected`` names an object that is gone. The token is
        the ETag (the MD5 of the bytes on AWS without KMS: equal content, equal token)."""
        name = self._name(key)
        condition = {"IfNoneMatch": "*"} if expected is None else {"IfMatch": expected}
        try:
            response: dict[str, Any] = self._client.put_object(Bucket=self.bucket, Key=name, Body=bytes(data),
                                                               **condition)
        except ClientError as exc:
            if _code(exc) in _PRECONDITION_CODES:
                return None
            if expected is not None and _code(exc) in _MISSING_CODES:
                return None
            self._fail(exc, "store", key)
        except BotoCoreError as exc:
            self._fail(exc, "store", key)
        return str(response["ETag"])

    def _or_none(self, key: str, request: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        """The response of a read ``request`` of ``key``, or None when there is no such object
        (other failures: ``_fail``)."""
        try:
            return request()
        except ClientError as exc:
            if _code(exc) in _MISSING_CODES:
                return None
            self._fail(exc, "read", key)
        except BotoCoreError as exc:
            self._fail(exc, "read", key)

    def _head(self, key: str) -> dict[str, Any] | None:
        """The object's HEAD response, or None if there is no such object."""
        name = self._name(key)
        return self._or_none(key, lambda: self._client.head_object(Bucket=self.bucket, Key=name))

    def _stat(self, key: str) -> dict[str, Any]:
        head = self._head(key)
        if head is None:
            raise missing(key, self.url)
        return head

    def _get_body(self, key: str, offset: int, length: int | None) -> Any:
        """The response of a (ranged) GET, checked to hold exactly ``length`` bytes."""
        name = self._name(key)
        args: dict[str, Any] = {"Bucket": self.bucket, "Key": name}
        if length is not None:
            args["Range"] = f"bytes={offset}-{offset + length - 1}"
        try:
            response: dict[str, Any] = self._client.get_object(**args)
        except ClientError as exc:
            code = _code(exc)
            if code in _MISSING_CODES:
                raise missing(key, self.url) from exc
            if code == "InvalidRange" and length is not None:
                raise short_read(key, offset, length, self.size(key)) from exc
            self._fail(exc, "read", key)
        except BotoCoreError as exc:
            self._fail(exc, "read", key)
        if length is not None and int(response["ContentLength"]) != length:
            response["Body"].close()
            total = str(response.get("ContentRange", "")).rpartition("/")[2]
            raise short_read(key, offset, length, int(total) if total.isdigit() else self.size(key))
        return response["Body"]

    def get(self, key: str) -> bytes:
        return self._read_all(key, self._get_body(key, 0, None))

    def _read_all(self, key: str, body: Any) -> bytes:
        """A response body's bytes, the body closed (StorageError when the connection fails)."""
        try:
            data: bytes = body.read()
        except (BotoCoreError, OSError) as exc:
            raise StorageError(detail=f"cannot read {key!r} from {self.url} ({exc})") from exc
        finally:
            body.close()
        return data

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        check_range(offset, length)
        out = bytearray(length)
        self.read_into(key, offset, memoryview(out))
        return bytes(out)

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        check_range(offset, 0)
        view = out if out.format == "B" and out.ndim == 1 else out.cast("B")
        length = len(view)
        if length == 0:
            # HTTP cannot ask for zero bytes; the object must still exist and reach ``offset``.
            size = self.size(key)
            if offset > size:
                raise short_read(key, offset, length, size)
            return
        body = self._get_body(key, offset, length)
        done = 0
        try:
            while done < length:
                got = body.readinto(view[done:])
                if not got:
                    break
                done += got
        except (BotoCoreError, OSError) as exc:
            raise StorageError(detail=f"cannot read {key!r} from {self.url} ({exc})") from exc
        finally:
            body.close()
        if done != length:
            raise StorageError(detail=f"object {key!r} in {self.url}: connection ended after {done} of {length} bytes")

    def size(self, key: str) -> int:
        return int(self._stat(key)["ContentLength"])

    def mtime(self, key: str) -> float:
        return float(self._stat(key)["LastModified"].timestamp())

    def exists(self, key: str) -> bool:
        return self._head(key) is not None

    def list(self, prefix: str = "") -> Iterator[str]:
        """Keys under ``prefix``, sorted; objects whose names are no valid key (not ckptrepo's) are skipped."""
        return (key for key, _ in self.list_sized(prefix))

    def list_sized(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        check_prefix(prefix)
        base = f"{self.prefix}/" if self.prefix else ""
        keys: list[tuple[str, int]] = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base + prefix)
            for page in pages:
                for item in page.get("Contents", ()):
                    key = str(item["Key"])[len(base) :]
                    with suppress(UsageError):
                        keys.append((check_key(key), int(item["Size"])))
        except (BotoCoreError, ClientError) as exc:
            self._fail(exc, "list")
        return iter(sorted(keys))

    def delete(self, key: str) -> None:
        name = self._name(key)
        try:
            self._client.delete_object(Bucket=self.bucket, Key=name)
        except ClientError as exc:
            if _code(exc) not in _MISSING_CODES:
                self._fail(exc, "delete", key)
        except BotoCoreError as exc:
            self._fail(exc, "delete", key)

    def close(self) -> None:
        with suppress(AttributeError):
            self._client.close()
