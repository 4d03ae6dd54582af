"""Views of the test project: a hello, two dependencies, a write, rate-limited routes."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

import floodwall as fw
import floodwall.django


def _dependency(name: str) -> list[str]:
    if settings.DOWN.exists():
        raise ConnectionError(f"{name} is down")
    return [f"{name} answered"]


def hello(request: HttpRequest) -> JsonResponse:
    admission = request.floodwall
    return JsonResponse(
        {
            "attempt": admission.attempt,
            "remaining": fw.remaining(),
            "retry": fw.current_retry() is not None,
        }
    )


async def hello_async(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"remaining": fw.remaining(), "async": True})


def reviews(request: HttpRequest) -> JsonResponse:
    resource = floodwall.django.registry().get("reviews")
    return JsonResponse({"reviews": resource.call(_dependency, "reviews")})


def payments(request: HttpRequest) -> JsonResponse:
    resource = floodwall.django.registry().get("payments")
    return JsonResponse({"payments": resource.call(_dependency, "payments")})


COUNTS: dict[str, int] = {}


def orders(request: HttpRequest) -> HttpResponse:
    COUNTS["orders"] = COUNTS.get("orders", 0) + 1
    body: Any = json.loads(request.body or b"{}")
    return JsonResponse({"order": COUNTS["orders"], "item": body.get("item")}, status=201)


def quota(request: HttpRequest) -> HttpResponse:
    floodwall.django.registry().get("quota").call(lambda: None)
    return HttpResponse("ok")


def limited(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")
