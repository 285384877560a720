from django.urls import path

from taskhub.accounts import people_views

app_name = "people"

urlpatterns = [
    path("", people_views.people_list, name="list"),
    path("<int:user_id>/", people_views.person_detail, name="detail"),
    path("<int:user_id>/state", people_views.person_state, name="state"),
    path("<int:user_id>/password", people_views.person_password, name="password"),
]
