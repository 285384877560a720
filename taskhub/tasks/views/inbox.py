from django.shortcuts import render


def inbox(request):
    return render(request, "web/coming_soon.html", {"title": "Inbox"})


def answer(request, request_id):
    return render(request, "web/coming_soon.html", {"title": "Answer"})
