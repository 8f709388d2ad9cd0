"""The base of every fact table: rows are inserted once and never changed or deleted."""
from __future__ import annotations

import random
from typing import Any, ClassVar, Sequence

from django.db import models
from django.utils.translation import gettext_lazy as _


class FactsAreAppendOnly(Exception):
    """Raised on any attempt to change or delete a fact: facts never change."""


class FactQuerySet(models.QuerySet):
    def update(self, **kwargs: Any) -> int:
        raise FactsAreAppendOnly(f"{self.model.__name__} rows are facts and cannot be updated")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise FactsAreAppendOnly(f"{self.model.__name__} rows are facts and cannot be deleted")

    def bulk_update(self, objs: Any, fields: Any, batch_size: Any = None) -> int:
        raise FactsAreAppendOnly(f"{self.model.__name__} rows are facts and cannot be updated")

    def update_or_create(self, *args: Any, **kwargs: Any) -> Any:
        raise FactsAreAppendOnly(f"{self.model.__name__} rows are facts and cannot be updated")


class FactModel(models.Model):
    """A row of a stream's backing table.

    Subclasses name the column holding the stream ID (``STREAM_ID_FIELD``) and the fields
    sent on the wire, in Synapse's order (``WIRE_FIELDS``). Rows are written only through a
    :class:`streams.writer.StreamWriter`, which reserves the stream ID first.
    """

    STREAM_ID_FIELD: ClassVar[str] = "stream_id"
    WIRE_FIELDS: ClassVar[Sequence[str]] = ()

    #: Not ``db_index``: on PostgreSQL that adds a second, ``varchar_pattern_ops`` "like"
    #: index nothing uses. Each table declares ``(instance_name, <stream ID>)`` in its Meta:
    #: the one index catch-up pages (one writer's rows in a token range) and the admin's
    #: writer filter need. Every index is paid for on each inserted row.
    instance_name = models.CharField(_("writer"), max_length=255)

    objects = FactQuerySet.as_manager()

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise FactsAreAppendOnly(f"{type(self).__name__} rows are facts and cannot be updated")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        raise FactsAreAppendOnly(f"{type(self).__name__} rows are facts and cannot be deleted")

    @classmethod
    def wire_row(cls, values: Sequence[Any]) -> list[Any]:
        """The RDATA row for the ``WIRE_FIELDS`` values of one database row."""
        return list(values)

    @classmethod
    def synthetic(cls, rng: random.Random, n: int) -> dict[str, Any]:
        """Field values of a synthetic fact number ``n`` (for ``write_facts``)."""
        raise NotImplementedError
