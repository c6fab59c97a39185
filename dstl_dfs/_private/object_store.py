"""Object stores the DFS storage writes to: any fsspec URL, and botocore directly for S3.

Every store offers the same six operations on keys relative to the base path;
``put_new`` never overwrites (unique names, conditional puts for markers).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlparse

from dstl.spi import Config, ConfigError, DstlError, StorageError
from dstl.spi.kit.durability import fsync_directory

from ..options import (
    BASE_PATH,
    DOWNLOAD_TIMEOUT,
    S3_ACCESS_KEY_ID,
    S3_ENDPOINT_URL,
    S3_FAST_PATH,
    S3_REGION,
    S3_SECRET_ACCESS_KEY,
    UPLOAD_NUM_THREADS,
    UPLOAD_TIMEOUT,
)


class ObjectExistsError(StorageError):
    """``put_new`` found the key already taken (conditional put failed)."""


_USER_OPTIONS = "dstl.dfs.storage-options."  # fsspec options passed through


class ObjectStore(ABC):
    """Keys relative to the base path; values are whole objects."""

    url: str

    @abstractmethod
    def put_new(self, key: str, data: bytes) -> None:
        """Create ``key``; :class:`ObjectExistsError` if it exists (never overwrites)."""

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The whole object; :class:`StorageError` when missing."""

    @abstractmethod
    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the object (fewer at its end)."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Delete ``key``; missing keys are fine."""

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Keys below ``prefix`` (recursive)."""

    @abstractmethod
    def list_modified(self, prefix: str) -> dict[str, float | None]:
        """Keys below ``prefix`` with their modification time in the store's clock (``None``: unknown)."""

    def store_now(self, probe_prefix: str) -> float | None:
        """The store's clock now: the modification time of a probe object written under ``probe_prefix``.

        Ages compared with it are measured by one clock, whatever the writers' clocks say.
        """
        key = f"{probe_prefix.rstrip('/')}/{uuid.uuid4().hex}"
        self.put_new(key, b"")
        try:
            return self.list_modified(key).get(key)
        finally:
            self.delete(key)

    def close(self) -> None:  # noqa: B027 - optional
        """Release clients."""

    def describe(self, key: str) -> str:
        """Full URL of ``key`` for messages."""
        return f"{self.url.rstrip('/')}/{key}"


class FsspecStore(ObjectStore):
    """Any fsspec filesystem (file://, memory://, gs://, s3:// through s3fs, ...)."""

    def __init__(self, url: str, storage_options: dict[str, object] | None = None) -> None:
        import fsspec

        self.url = url
        self.fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        self.root = root.rstrip("/")
        self._local = self.fs.protocol in ("file", "local") or "file" in (self.fs.protocol or ())

    def path_of(self, key: str) -> str:
        """The fsspec path of object ``key``."""
        return f"{self.root}/{key}"

    @contextlib.contextmanager
    def _translate(self, action: str, key: str) -> Iterator[None]:
        """Turn OS errors into dstl's: missing key, taken key, anything else."""
        try:
            yield
        except FileExistsError as exc:
            msg = f"object {self.describe(key)} already exists"
            raise ObjectExistsError(msg) from exc
        except FileNotFoundError as exc:
            msg = f"object {self.describe(key)} does not exist (was it discarded?)"
            raise StorageError(msg) from exc
        except DstlError:
            raise
        except Exception as exc:
            msg = f"{action} {self.describe(key)} failed: {type(exc).__name__}: {exc}"
            raise StorageError(msg, retriable=True) from exc

    def put_new(self, key: str, data: bytes) -> None:
        path = self.path_of(key)
        with self._translate("writing", key):
            if self._local:
                # O_EXCL: the local equivalent of a conditional put.
                created = _make_directories(os.path.dirname(path))
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                    os.fsync(fd)
                finally:
                    os.close(fd)
                # The object is acknowledged once its directory entry (and those of the
                # directories just made) are durable too: a power loss keeps it.
                fsync_directory(os.path.dirname(path))
                for directory in created:
                    fsync_directory(os.path.dirname(directory))
                return
            # fsspec's exclusive create: FileExistsError when taken (s3fs sends If-None-Match: *),
            # atomic in the store, so no lock and no exists() round trip.
            self.fs.pipe_file(path, data, mode="create")

    def get(self, key: str) -> bytes:
        with self._translate("reading", key):
            return self.fs.cat_file(self.path_of(key))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        with self._translate("reading", key):
            return self.fs.cat_file(self.path_of(key), start=start, end=end)

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self.path_of(key))

    def list(self, prefix: str) -> list[str]:
        base = self.path_of(prefix).rstrip("/")
        with self._translate("listing", prefix):
            try:
                found = self.fs.find(base)
            except FileNotFoundError:
                return []
        root = self.root + "/"
        return sorted(p[len(root) :] if p.startswith(root) else p for p in found)

    def list_modified(self, prefix: str) -> dict[str, float | None]:
        base = self.path_of(prefix).rstrip("/")
        with self._translate("listing", prefix):
            try:
                found = self.fs.find(base, detail=True)
            except FileNotFoundError:
                return {}
        root = self.root + "/"
        return {
            (path[len(root) :] if path.startswith(root) else path): _modified(info)
            for path, info in found.items()
        }


class S3Store(ObjectStore):
    """Direct S3 calls: PutObject with ``If-None-Match: *``, GetObject, DeleteObject.

    Through botocore, which s3fs already brings (through aiobotocore): no boto3, whose
    releases each pin one botocore and would make an installer backtrack to match
    aiobotocore's narrow botocore range.
    """

    def __init__(self, url: str, config: Config) -> None:
        import botocore.session
        from botocore.config import Config as BotoConfig

        parsed = urlparse(url)
        if not parsed.netloc:
            msg = f"dstl.dfs.base-path {url!r} names no bucket: use s3://BUCKET/prefix"
            raise ConfigError(msg)
        self.url = url
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        timeout = config.get(UPLOAD_TIMEOUT)
        session = botocore.session.get_session()  # credentials: the config's, else AWS's chain
        # dstl retries and hedges itself; botocore's own retries would hide slow attempts.
        boto_config = BotoConfig(
            connect_timeout=max(1.0, timeout),
            read_timeout=max(5.0, timeout * 5),
            retries={"total_max_attempts": 1, "mode": "standard"},
            max_pool_connections=max(10, config.get(UPLOAD_NUM_THREADS) * 4),
        )
        self.client = session.create_client(
            "s3",
            region_name=config.get(S3_REGION),
            endpoint_url=config.get(S3_ENDPOINT_URL),
            aws_access_key_id=config.get(S3_ACCESS_KEY_ID),
            aws_secret_access_key=config.get(S3_SECRET_ACCESS_KEY),
            config=boto_config,
        )

    def key_of(self, key: str) -> str:
        """The S3 key of object ``key`` (under the base path's prefix)."""
        return f"{self.prefix}/{key}" if self.prefix else key

    @contextlib.contextmanager
    def _translate(self, action: str, key: str) -> Iterator[None]:
        """Turn botocore errors into dstl's: missing key, taken key, anything else."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("PreconditionFailed", "ConditionalRequestConflict", "412"):
                msg = f"object {self.describe(key)} already exists"
                raise ObjectExistsError(msg) from exc
            if code in ("NoSuchKey", "404"):
                msg = f"object {self.describe(key)} does not exist (was it discarded?)"
                raise StorageError(msg) from exc
            msg = f"{action} {self.describe(key)} failed: {code or type(exc).__name__}: {exc}"
            raise StorageError(msg, retriable=True) from exc
        except (BotoCoreError, OSError) as exc:
            msg = f"{action} {self.describe(key)} failed: {type(exc).__name__}: {exc}"
            raise StorageError(msg, retriable=True) from exc
        except DstlError:
            raise
        except Exception as exc:
            msg = f"{action} {self.describe(key)} failed: {type(exc).__name__}: {exc}"
            raise StorageError(msg, retriable=True) from exc

    def put_new(self, key: str, data: bytes) -> None:
        with self._translate("writing", key):
            self.client.put_object(Bucket=self.bucket, Key=self.key_of(key), Body=data, IfNoneMatch="*")

    def get(self, key: str) -> bytes:
        with self._translate("reading", key):
            return self.client.get_object(Bucket=self.bucket, Key=self.key_of(key))["Body"].read()

    def get_range(self, key: str, start: int, end: int) -> bytes:
        byte_range = f"bytes={start}-{max(start, end - 1)}"
        with self._translate("reading", key):
            return self.client.get_object(Bucket=self.bucket, Key=self.key_of(key), Range=byte_range)[
                "Body"
            ].read()

    def delete(self, key: str) -> None:
        with self._translate("deleting", key):
            self.client.delete_object(Bucket=self.bucket, Key=self.key_of(key))

    def list(self, prefix: str) -> list[str]:
        keys: list[str] = []
        with self._translate("listing", prefix):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.key_of(prefix)
            )
            for page in pages:
                keys.extend(item["Key"] for item in page.get("Contents", ()))
        strip = len(self.prefix) + 1 if self.prefix else 0
        return sorted(k[strip:] for k in keys)

    def list_modified(self, prefix: str) -> dict[str, float | None]:
        found: dict[str, float | None] = {}
        strip = len(self.prefix) + 1 if self.prefix else 0
        with self._translate("listing", prefix):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.key_of(prefix)
            )
            for page in pages:
                for item in page.get("Contents", ()):
                    found[item["Key"][strip:]] = item["LastModified"].timestamp()
        return found

    def close(self) -> None:
        self.client.close()


def _modified(info: Mapping[str, Any]) -> float | None:
    """A listing entry's modification time as epoch seconds, in whatever form the filesystem gives it."""
    for field in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(field)
        if isinstance(value, datetime.datetime):
            return value.timestamp()
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return None


def open_store(config: Config, *, for_markers: bool = False) -> ObjectStore:
    """The store for ``dstl.dfs.base-path``: botocore for s3:// (fast path), else fsspec."""
    url = config.get(BASE_PATH)
    if not url:
        msg = "dstl.dfs.base-path is not set: set it to an fsspec URL, e.g. s3://bucket/dstl or file:///data/dstl"
        raise ConfigError(msg)
    scheme = urlparse(url).scheme or "file"
    if scheme in ("s3", "s3a"):
        if for_markers or config.get(S3_FAST_PATH):
            return S3Store(url, config)
        # dstl bounds and retries reads itself (dstl.dfs.download.*): one attempt per s3fs call.
        timeout = config.get(DOWNLOAD_TIMEOUT)
        options: dict[str, object] = {
            "config_kwargs": {
                "connect_timeout": timeout,
                "read_timeout": timeout,
                "retries": {"total_max_attempts": 1, "mode": "standard"},
            },
        }
        if config.get(S3_ENDPOINT_URL):
            options["client_kwargs"] = {"endpoint_url": config.get(S3_ENDPOINT_URL)}
        if config.get(S3_ACCESS_KEY_ID):
            options["key"] = config.get(S3_ACCESS_KEY_ID)
            options["secret"] = config.get(S3_SECRET_ACCESS_KEY)
        store = FsspecStore(url, {**options, **config.options_under(_USER_OPTIONS)})
        store.fs.retries = 1  # s3fs's own retry loop (a class attribute, not an argument)
        return store
    return FsspecStore(url, config.options_under(_USER_OPTIONS))


def _make_directories(directory: str) -> list[str]:
    """``os.makedirs``; returns the directories it created, deepest first."""
    missing = []
    current = directory
    while current and not os.path.isdir(current):
        missing.append(current)
        current = os.path.dirname(current)
    os.makedirs(directory, exist_ok=True)
    return missing
