from django.urls import path

from dashboard import views
from dashboard.job_panel import cancel_job, job_log, start_job
from dashboard.metrics import metrics_view

app_name = "dashboard"
urlpatterns = [
    path("", views.streams_page, name="streams"),
    path("connections/", views.connections_page, name="connections"),
    path("connections/users/", views.syncing_users_page, name="syncing-users"),
    path("status.json", views.streams_json, name="streams-json"),
    path("facts-per-minute.json", views.facts_per_minute_json, name="facts-per-minute-json"),
    path("metrics", metrics_view, name="metrics"),
    path("jobs/start", start_job, name="start-job"),
    path("jobs/<int:run_id>/cancel", cancel_job, name="cancel-job"),
    path("jobs/<int:run_id>/log", job_log, name="job-log"),
    path("jobs/<int:run_id>/findings", views.job_findings_page, name="job-findings"),
]
