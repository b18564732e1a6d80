"""Which shard names are URLs, and what a prefix or a glob stands for.

Brace patterns are expanded before this (``webdataset.expand_urls``); here a
remote name ending in ``/`` stands for every object under that prefix and a
name with ``*``, ``?`` or ``[`` for the objects matching it, listed from the
store in name order, as a local folder or glob would be.  ``file://`` names
are local paths.
"""

import fnmatch
import urllib.parse

from ..shard_index import SUFFIX

REMOTE_SCHEMES = ("s3", "s3a", "gs", "az", "azure", "abfs", "abfss", "adl", "http", "https")
_GLOB = "*?["


def scheme(name):
    """The URL scheme of ``name`` in lower case, or "" for a path."""
    head, sep, _ = name.partition("://")
    return head.lower() if sep and head.isalnum() else ""


def is_remote(name):
    """True when ``name`` is a URL fastload reads through the store."""
    return scheme(name) in REMOTE_SCHEMES


def split(url):
    """``(base, key)``: the store's root (scheme and bucket, container or
    host) and the object's path under it.  As obstore (object_store) and
    fsspec read them: ``s3://bucket/key``, ``gs://bucket/key``,
    ``az://container/key`` (``azure://``, ``adl://``, ``abfs[s]://`` alike;
    the account from ``AZURE_STORAGE_ACCOUNT_NAME`` or ``storage_options``),
    ``abfss://container@account.dfs.core.windows.net/key``."""
    parts = urllib.parse.urlsplit(url)
    key = parts.path.lstrip("/")
    if parts.query:
        key += "?" + parts.query
    return f"{parts.scheme}://{parts.netloc}", key


def local_path(name):
    """A ``file://`` URL as a path; any other name as it is."""
    if scheme(name) == "file":
        parts = urllib.parse.urlsplit(name)
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{name}: a file:// URL names a path on this machine")
        return urllib.parse.unquote(parts.path)
    return name


def resolve(names, list_objects):
    """The shard names ``names`` stand for: ``file://`` URLs as paths,
    remote prefixes and globs replaced by the objects they match (through
    ``list_objects(base, prefix) -> keys``), the rest as they are.  A prefix
    or glob that matches nothing is an error naming it."""
    out = []
    for name in names:
        name = local_path(name)
        if not is_remote(name):
            out.append(name)
            continue
        base, key = split(name)
        glob_at = min((key.find(c) for c in _GLOB if c in key), default=-1)
        if not key.endswith("/") and glob_at < 0:
            out.append(name)
            continue
        # Stores list by folder (object_store's prefixes are whole path segments).
        prefix = key if glob_at < 0 else key[:key.rfind("/", 0, glob_at) + 1]
        keys = sorted(list_objects(base, prefix))
        if glob_at >= 0:
            keys = [k for k in keys if fnmatch.fnmatchcase(k, key)]
        else:
            keys = [k for k in keys if not k.endswith("/") and not _is_sidecar(k)]
        if not keys:
            raise FileNotFoundError(f"{name}: no objects match")
        out.extend(f"{base}/{k}" for k in keys)
    return out


def _is_sidecar(key):
    """Index files beside the shards are not shards."""
    return key.endswith(SUFFIX)
