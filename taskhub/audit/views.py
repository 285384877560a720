from django.shortcuts import render


def audit_list(request):
    return render(request, "web/coming_soon.html", {"title": "Audit"})


def audit_export(request, fmt):
    return render(request, "web/coming_soon.html", {"title": "Audit export"})
