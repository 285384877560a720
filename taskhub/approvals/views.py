"""The admins' page of approval policies: list, create, edit, remove, and a policy's webhooks with their recent
deliveries. Thin: the services do the work."""

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.translation import gettext
from django.views.decorators.http import require_POST

from taskhub.accounts.permissions import admin_required
from taskhub.approvals import services, webhooks
from taskhub.approvals.forms import PolicyForm, WebhookForm
from taskhub.approvals.models import ApprovalPolicy, PolicyWebhook
from taskhub.approvals.rules import answerer_names, deadline_words

LIST_TEMPLATE = "approvals/list.html"
FORM_TEMPLATE = "approvals/form.html"


@admin_required
def policy_list(request):
    policies = ApprovalPolicy.objects.select_related("server", "escalation_group").prefetch_related("groups", "users")
    server = request.GET.get("server", "")
    if server.isdigit():
        policies = policies.filter(server_id=int(server))
    rows = [
        {
            "policy": policy,
            "answerers": answerer_names(policy, none_named=gettext("all approvers")),
            "deadline": deadline_words(policy),
        }
        for policy in policies
    ]
    return render(request, LIST_TEMPLATE, {"rows": rows})


@admin_required
def policy_add(request):
    initial = {"server": request.GET["server"]} if request.GET.get("server", "").isdigit() else None
    form = PolicyForm.for_policy(None, data=request.POST if request.method == "POST" else None, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            services.create_policy(
                server=form.cleaned_data["server"],
                groups=form.cleaned_data["groups"],
                users=form.cleaned_data["users"],
                user=request.user,
                **form.terms(),
            )
        except services.PolicyInvalid as invalid:
            form.add_error(None, str(invalid))
        else:
            messages.success(request, gettext("The approval policy is saved."))
            return redirect("approvals:list")
    return render(request, FORM_TEMPLATE, {"form": form, "policy": None}, status=400 if form.errors else 200)


def _webhooks_context(policy: ApprovalPolicy, webhook_form: WebhookForm | None = None) -> dict:
    return {
        "policy": policy,
        "webhooks": list(policy.webhooks.all()),
        "webhook_form": webhook_form or WebhookForm(),
        "deliveries": list(webhooks.recent_deliveries(policy)),
    }


@admin_required
def policy_edit(request, policy_id):
    policy = get_object_or_404(ApprovalPolicy.objects.select_related("server"), pk=policy_id)
    if request.htmx and request.method == "GET":  # the deliveries, refreshed while the page is open
        return render(request, f"{FORM_TEMPLATE}#webhook-deliveries", _webhooks_context(policy))
    form = PolicyForm.for_policy(policy, data=request.POST if request.method == "POST" else None)
    form.fields["server"].disabled = True
    if request.method == "POST" and form.is_valid():
        try:
            services.update_policy(
                policy=policy,
                groups=form.cleaned_data["groups"],
                users=form.cleaned_data["users"],
                user=request.user,
                **form.terms(),
            )
        except services.PolicyInvalid as invalid:
            form.add_error(None, str(invalid))
        else:
            messages.success(request, gettext("The approval policy is saved."))
            return redirect("approvals:list")
    context = {"form": form, "policy": policy, **_webhooks_context(policy)}
    return render(request, FORM_TEMPLATE, context, status=400 if form.errors else 200)


@admin_required
@require_POST
def policy_remove(request, policy_id):
    policy = get_object_or_404(ApprovalPolicy, pk=policy_id)
    services.remove_policy(policy=policy, user=request.user)
    messages.success(request, gettext("The approval policy is removed: every approver answers there now."))
    return redirect("approvals:list")


@admin_required
@require_POST
def webhook_add(request, policy_id):
    policy = get_object_or_404(ApprovalPolicy.objects.select_related("server"), pk=policy_id)
    webhook_form = WebhookForm(data=request.POST)
    if webhook_form.is_valid():
        try:
            webhooks.create_webhook(policy=policy, user=request.user, **webhook_form.cleaned_data)
        except webhooks.WebhookInvalid as invalid:
            webhook_form.add_error(None, str(invalid))
        else:
            messages.success(request, gettext("The webhook is added."))
            return redirect("approvals:edit", policy_id=policy.pk)
    context = {"form": PolicyForm.for_policy(policy), "policy": policy, **_webhooks_context(policy, webhook_form)}
    context["form"].fields["server"].disabled = True
    return render(request, FORM_TEMPLATE, context, status=400)


@admin_required
@require_POST
def webhook_switch(request, policy_id, webhook_id):
    webhook = get_object_or_404(PolicyWebhook, pk=webhook_id, policy_id=policy_id)
    webhooks.update_webhook(webhook=webhook, enabled=not webhook.enabled, user=request.user)
    messages.success(
        request,
        gettext("The webhook sends deliveries again.") if not webhook.enabled else gettext("The webhook is off."),
    )
    return redirect("approvals:edit", policy_id=policy_id)


@admin_required
@require_POST
def webhook_remove(request, policy_id, webhook_id):
    webhook = get_object_or_404(PolicyWebhook, pk=webhook_id, policy_id=policy_id)
    webhooks.remove_webhook(webhook=webhook, user=request.user)
    messages.success(request, gettext("The webhook is removed, with its deliveries."))
    return redirect("approvals:edit", policy_id=policy_id)
