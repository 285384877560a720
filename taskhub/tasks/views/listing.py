from django.shortcuts import render


def task_list(request):
    return render(request, "web/coming_soon.html", {"title": "Tasks"})


def task_detail(request, task_id):
    return render(request, "web/coming_soon.html", {"title": "Task"})


def task_cancel(request, task_id):
    return render(request, "web/coming_soon.html", {"title": "Cancel"})
