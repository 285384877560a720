"""The audit trail in the Django admin: read-only for everyone, superusers included.

Refusing add / change / delete here is courtesy; the database trigger (migration 0003) is what finally
refuses an UPDATE or DELETE of audit_auditevent, whoever asks.
"""

import json
from typing import ClassVar

from django.contrib import admin
from django.utils.html import format_html

from taskhub.audit.models import AuditEvent


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ("time", "actor_label", "action", "description", "task_id", "server_id")
    list_filter = ("action", ("time", admin.DateFieldListFilter))
    search_fields = ("actor_label", "action")
    date_hierarchy = "time"
    ordering = ("-time", "-id")
    list_per_page = 100
    show_full_result_count = False
    actions = None  # no bulk "delete selected"
    fields = ("time", "actor_label", "actor_id", "action", "description", "task_id", "server_id", "data_json")
    readonly_fields = fields

    class Media:
        css: ClassVar[dict[str, tuple[str, ...]]] = {"all": ("taskhub/audit-admin.css",)}

    @admin.display(description="description")
    def description(self, event: AuditEvent) -> str:
        return event.description

    @admin.display(description="data")
    def data_json(self, event: AuditEvent) -> str:
        # Escaped by format_html: the data can hold text an MCP server sent.
        text = json.dumps(event.data, ensure_ascii=False, indent=2, sort_keys=True, default=str)
        return format_html('<pre class="audit-admin-json">{}</pre>', text)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
