from django.shortcuts import render


def choose_tool(request):
    return render(request, "web/coming_soon.html", {"title": "Launch"})


def launch_tool(request, server_id, tool):
    return render(request, "web/coming_soon.html", {"title": "Launch"})
