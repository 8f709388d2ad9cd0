from django.urls import path

from . import views

app_name = "dashboard"
urlpatterns = [
    path("", views.streams_page, name="streams"),
    path("status.json", views.streams_json, name="streams-json"),
]
