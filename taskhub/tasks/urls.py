from django.urls import path

from taskhub.tasks.views import bulk, inbox, launch, listing

app_name = "tasks"

urlpatterns = [
    path("tasks/", listing.task_list, name="list"),
    path("tasks/<uuid:task_id>/", listing.task_detail, name="detail"),
    path("tasks/<uuid:task_id>/cancel", listing.task_cancel, name="cancel"),
    path("tasks/<uuid:task_id>/confirm-cancel", listing.task_cancel_confirm, name="cancel_confirm"),
    path("tasks/cancel-many", bulk.cancel_many, name="cancel_many"),
    path("launch/", launch.choose_tool, name="launch"),
    path("launch/<int:server_id>/<path:tool>/", launch.launch_tool, name="launch_tool"),
    path("inbox/", inbox.inbox, name="inbox"),
    path("inbox/<int:request_id>/answer", inbox.answer, name="answer"),
    path("inbox/answer-like", inbox.answer_like, name="answer_like"),
]
