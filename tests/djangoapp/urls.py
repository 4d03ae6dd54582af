from __future__ import annotations

from django.urls import path

from djangoapp import views
from floodwall.django.views import metrics

urlpatterns = [
    path("hello", views.hello),
    path("hello-async", views.hello_async),
    path("reviews", views.reviews),
    path("payments", views.payments),
    path("orders", views.orders),
    path("limited", views.limited),
    path("quota", views.quota),
    path("metrics", metrics),
]
