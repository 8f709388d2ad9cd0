from django.urls import path

from rooms.api import views

urlpatterns = [
    path("rooms/<str:room_id>/state", views.room_state, name="api-room-state"),
    path("rooms/<str:room_id>/messages", views.room_messages, name="api-room-messages"),
    path("rooms/<str:room_id>/topological", views.room_topological, name="api-room-topological"),
    path("events/<str:event_id>", views.event, name="api-event"),
    path("sync", views.sync, name="api-sync"),
]
