from django.shortcuts import render


def server_list(request):
    return render(request, "web/coming_soon.html", {"title": "Servers"})


def server_add(request):
    return render(request, "web/coming_soon.html", {"title": "Add a server"})


def server_detail(request, server_id):
    return render(request, "web/coming_soon.html", {"title": "Server"})


def server_edit(request, server_id):
    return render(request, "web/coming_soon.html", {"title": "Edit server"})


def server_discover(request, server_id):
    return render(request, "web/coming_soon.html", {"title": "Discover"})
