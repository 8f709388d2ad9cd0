"""The chain cover index of the rooms' auth graphs (``streams.storage.chain_cover``;
docs/storage.md, "The chain cover index"). Names and columns follow Synapse's tables, plus ``room_id``
so the batch job can rebuild and check rooms one at a time."""
from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class EventAuthChain(models.Model):
    """A state event's position: the ``sequence_number``-th event of chain ``chain_id``."""

    event_id = models.CharField(_("event ID"), max_length=255)
    room_id = models.CharField(_("room ID"), max_length=255)
    chain_id = models.BigIntegerField(_("chain"))
    sequence_number = models.BigIntegerField(_("sequence number"))

    class Meta:
        db_table = "event_auth_chains"
        constraints = [models.UniqueConstraint(fields=["event_id"], name="event_auth_chains_event"),
                       models.UniqueConstraint(fields=["chain_id", "sequence_number"],
                                               name="event_auth_chains_c_seq")]
        indexes = [models.Index(fields=["room_id"], name="event_auth_chains_room")]


class EventAuthChainLink(models.Model):
    """The origin position reaches the target position (and so everything below it)."""

    room_id = models.CharField(_("room ID"), max_length=255)
    origin_chain_id = models.BigIntegerField(_("origin chain"))
    origin_sequence_number = models.BigIntegerField(_("origin sequence number"))
    target_chain_id = models.BigIntegerField(_("target chain"))
    target_sequence_number = models.BigIntegerField(_("target sequence number"))

    class Meta:
        db_table = "event_auth_chain_links"
        indexes = [
            models.Index(fields=["origin_chain_id", "target_chain_id"], name="event_auth_chain_links_idx"),
            models.Index(fields=["room_id"], name="event_auth_chain_links_room"),
        ]


class EventAuthChainToCalculate(models.Model):
    """A state event not indexed yet: one of its auth events has no position (typically an
    out-of-band membership whose auth chain we do not have). Placed when it arrives."""

    event_id = models.CharField(_("event ID"), max_length=255)
    room_id = models.CharField(_("room ID"), max_length=255)
    type = models.CharField(_("type"), max_length=255)
    state_key = models.CharField(_("state key"), max_length=255)

    class Meta:
        db_table = "event_auth_chain_to_calculate"
        constraints = [models.UniqueConstraint(fields=["event_id"], name="event_auth_chain_to_calc_event")]
        indexes = [models.Index(fields=["room_id"], name="event_auth_chain_to_calc_room")]
