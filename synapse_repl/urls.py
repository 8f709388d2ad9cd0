from functools import partial

from django.contrib import admin
from django.contrib.staticfiles.views import serve as serve_static
from django.urls import include, path, re_path

urlpatterns = [
    path("admin/", admin.site.urls),
    # One process serves its own few static files (admin and dashboard assets); no separate
    # web server or collectstatic step is needed to run it.
    re_path(r"^static/(?P<path>.*)$", partial(serve_static, insecure=True)),
    path("", include("dashboard.urls")),
]
