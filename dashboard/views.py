from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from streams.conf import instance_name, repl_setting
from streams.status import stream_status


def streams_page(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboard/streams.html", {
        "streams": stream_status(),
        "instance_name": instance_name(),
        "server_name": repl_setting("SERVER_NAME"),
        "stuck_after": repl_setting("STUCK_AFTER_SECONDS"),
    })


def streams_json(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"streams": [
        {
            "name": s.name,
            "writers": s.writers,
            "positions": s.positions,
            "linear": s.linear,
            "pending": [
                {"writer": p.instance_name, "stream_ids": p.stream_ids, "age_seconds": round(p.age_seconds, 3),
                 "stuck": p.stuck}
                for p in s.pending
            ],
        }
        for s in stream_status()
    ]})
