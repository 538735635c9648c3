"""``local`` lives in :mod:`optcheck.pytorch.shards` (the probes read FSDP2 shards without
importing the distributed package); kept here for the distributed code that imports it."""

from optcheck.pytorch.shards import local  # noqa: F401
