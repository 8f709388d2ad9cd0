"""``manage.py diffsettings`` with secrets masked: Django's command prints every setting as is,
``DATABASE_URL``'s and ``REDIS_URL``'s passwords included; here each value first goes through
the debug page's filter (:class:`common.url_redaction.RedactingExceptionReporterFilter`)."""
from __future__ import annotations

from django.core.management.commands import diffsettings

from common.url_redaction import RedactingExceptionReporterFilter


class Command(diffsettings.Command):
    def handle(self, **options):
        cleanse = RedactingExceptionReporterFilter().cleanse_setting
        original = diffsettings.module_to_dict

        def cleansed_module_to_dict(module, omittable=lambda k: k.startswith("_") or not k.isupper()):
            return {k: repr(cleanse(k, getattr(module, k))) for k in dir(module) if not omittable(k)}

        diffsettings.module_to_dict = cleansed_module_to_dict
        try:
            return super().handle(**options)
        finally:
            diffsettings.module_to_dict = original
